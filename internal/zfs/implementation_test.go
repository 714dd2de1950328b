package zfs_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Implementation names the ZFS that answers here: the kernel module's
// OpenZFS where /dev/zfs exists, zfs-fuse otherwise; and it fails with
// ErrUnavailable when no zfs command can be found.
func TestImplementation(t *testing.T) {
	pool := zfstest.NewPool(t, 0) // ZFS answers (or the test fails under CI)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := zfs.NewClient(pool.Runner).Implementation(ctx)
	must.NoError(t, err)
	if _, err := os.Stat("/dev/zfs"); err == nil {
		must.True(t, strings.HasPrefix(got, "OpenZFS "), must.Sprint(got))
	} else {
		must.EqOp(t, "zfs-fuse", got)
	}

	missing := &zfs.Runner{ZFS: "/nonexistent/zfs", Zpool: "/nonexistent/zpool"}
	_, err = zfs.NewClient(missing).Implementation(ctx)
	must.True(t, errors.Is(err, zfs.ErrUnavailable), must.Sprint(err))
}
