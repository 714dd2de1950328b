package zfstest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestNewPool proves the helper's contract on real ZFS, without Main (ZFS
// already answers here, or the test stops through Unavailable): the pool
// exists with its mount point under the test's directory, ZFS and Prop work
// on it, and it is destroyed when the test that made it ends.
func TestNewPool(t *testing.T) {
	var name string
	t.Run("make and use", func(t *testing.T) {
		pool := NewPool(t, 0)
		name = pool.Name
		must.StrHasPrefix(t, "ndz", pool.Name)
		must.EqOp(t, filepath.Join(pool.Dir, "mnt"), pool.Mountpoint)

		ds := pool.Dataset("a")
		must.EqOp(t, pool.Name+"/a", ds)
		pool.ZFS(t, "create", "-o", "nomad:test=yes", ds)
		must.EqOp(t, filepath.Join(pool.Mountpoint, "a"), pool.Prop(t, ds, "mountpoint"))
		must.EqOp(t, "yes", pool.Prop(t, ds, "nomad:test"))
		must.EqOp(t, "", pool.Prop(t, ds, "nomad:unset"))
	})
	if name == "" {
		return // the subtest stopped before it had a pool, and says why
	}
	_, err := (&zfs.Runner{}).ZpoolCmd(context.Background(), "list", name)
	must.ErrorIs(t, err, zfs.ErrNotExist, must.Sprint("the pool is destroyed when its test ends"))
}
