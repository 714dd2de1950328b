package zfs_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Probe learns what this ZFS does by trying it on a scratch dataset it
// leaves no trace of. On the kernel module (OpenZFS, in the project's VM)
// every capability is there; on zfs-fuse 0.7 none is. SetMany then uses
// what was learned from its first call: one process on OpenZFS, one per
// property on zfs-fuse, never a refused multi-property attempt.
func TestProbe(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	c := zfs.NewClient(pool.Runner)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	caps, err := c.Probe(ctx, parent+"/.probe-caps")
	must.NoError(t, err)
	_, kernel := os.Stat("/dev/zfs")
	openzfs := kernel == nil
	must.EqOp(t, openzfs, caps.MultiSet, must.Sprintf("%+v", caps))
	if openzfs {
		must.True(t, caps.RenameMounted, must.Sprintf("%+v", caps))
	}
	// zfs-fuse refuses a mounted rename as "busy" most of the time, and
	// sometimes lets it through (seen twice in CI-like runs): the probe
	// reports what it saw, and nothing relies on it (releases always
	// unmount first), so either answer is right there.
	must.EqOp(t, openzfs, caps.Version, must.Sprintf("%+v", caps))
	must.EqOp(t, openzfs, caps.Encryption, must.Sprintf("%+v", caps))
	if !openzfs {
		must.EqOp(t, "zfs-fuse", caps.Implementation)
	}
	for _, name := range []string{parent + "/.probe-caps", parent + "/.probe-caps-renamed"} {
		_, err := pool.TryProp(name, "mounted")
		must.Error(t, err, must.Sprintf("%s must be gone", name))
	}

	slot := parent + "/slot"
	pool.ZFS(t, "create", slot)
	before := pool.Runner.Runs()
	must.NoError(t, c.SetMany(ctx, slot, map[string]string{"nomad-device-zfs-test:a": "1", "nomad-device-zfs-test:b": "2"}))
	want := int64(2)
	if openzfs {
		want = 1
	}
	must.EqOp(t, want, pool.Runner.Runs()-before)
	must.EqOp(t, "2", pool.Prop(t, slot, "nomad-device-zfs-test:b"))

	_, err = c.Probe(ctx, slot)
	must.ErrorIs(t, err, zfs.ErrExist, must.Sprint("an existing dataset is never a probe"))
	must.EqOp(t, "2", pool.Prop(t, slot, "nomad-device-zfs-test:b"))
}
