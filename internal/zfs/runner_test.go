package zfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) {
	// The test binary doubles as a "plugin" process for the tests of what
	// becomes of a zfs child when its parent dies (runner_proc_test.go). That
	// mode never goes near zfstest.Main, which may start a zfs-fuse daemon.
	if os.Getenv(helperEnv) != "" {
		os.Exit(runAsPluginHelper())
	}
	// And as another process that runs zfs through this package, for the
	// tests of the machine-wide mount gate (mountlock_test.go).
	if os.Getenv(gateHelperEnv) != "" {
		os.Exit(runAsGateHelper())
	}
	zfstest.Main(m)
}

func TestClient_RealPool(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	c := zfs.NewClient(pool.Runner)
	ctx := context.Background()
	parent := pool.Dataset("p")

	must.NoError(t, c.Create(ctx, parent, map[string]string{"refquota": "10485760", "com.example:x": "1"}))
	err := c.Create(ctx, parent, nil)
	must.ErrorIs(t, err, zfs.ErrExist)
	var zerr *zfs.Error
	must.True(t, errors.As(err, &zerr))
	must.StrContains(t, zerr.Stderr, "already exists")
	must.Eq(t, 1, zerr.ExitCode)

	_, err = c.Get(ctx, pool.Dataset("missing"), 0, "used")
	must.ErrorIs(t, err, zfs.ErrNotExist)

	must.NoError(t, c.Set(ctx, parent, "com.example:x", "2"))
	ds, err := c.Get(ctx, parent, 0, "refquota", "com.example:x")
	must.NoError(t, err)
	must.SliceLen(t, 1, ds)
	v, _ := ds[0].Local("com.example:x")
	must.Eq(t, "2", v)
	q, err := ds[0].Bytes("refquota")
	must.NoError(t, err)
	must.Eq(t, uint64(10485760), q)

	// Several datasets by name, in one process, none recursed into.
	child := parent + "/c"
	must.NoError(t, c.Create(ctx, child, nil))
	ds, err = c.GetNames(ctx, []string{pool.Name, parent}, "com.example:x")
	must.NoError(t, err)
	must.SliceLen(t, 2, ds)
	must.Eq(t, pool.Name, ds[0].Name)
	must.Eq(t, parent, ds[1].Name)
	_, err = c.GetNames(ctx, []string{parent, pool.Dataset("missing")}, "used")
	must.ErrorIs(t, err, zfs.ErrNotExist)
	must.NoError(t, c.Destroy(ctx, child))

	err = c.Set(ctx, parent, "compression", "no-such-algorithm")
	must.ErrorIs(t, err, zfs.ErrInvalid)

	h, err := c.PoolHealth(ctx, pool.Name)
	must.NoError(t, err)
	must.Eq(t, "ONLINE", h)
	_, err = c.PoolHealth(ctx, "nosuchpool")
	must.ErrorIs(t, err, zfs.ErrNotExist)

	must.NoError(t, c.Destroy(ctx, parent))
	must.ErrorIs(t, c.Destroy(ctx, parent), zfs.ErrNotExist)
}

// A dataset held open by a process is busy: the runner retries a bounded
// number of times, then returns ErrBusy. It never forces.
func TestRunner_BusyIsRetriedThenReported(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	ds := pool.Dataset("held")
	pool.ZFS(t, "create", ds)
	mp := pool.Prop(t, ds, "mountpoint")
	// Keep the directory busy as the working directory of a child process.
	startHolder(t, mp)

	r := &zfs.Runner{BusyRetries: 2, BusyBackoff: 50 * time.Millisecond}
	_, err := r.ZFSCmd(context.Background(), "unmount", ds)
	must.ErrorIs(t, err, zfs.ErrBusy)
	must.Eq(t, int64(3), r.Runs())
	must.Eq(t, "yes", pool.Prop(t, ds, "mounted"))
}

func TestRunner_Timeout(t *testing.T) {
	slow := filepath.Join(t.TempDir(), "slowzfs")
	must.NoError(t, os.WriteFile(slow, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755))
	r := &zfs.Runner{ZFS: slow, Timeout: 200 * time.Millisecond}
	start := time.Now()
	_, err := r.ZFSCmd(context.Background(), "list")
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.Less(t, 10*time.Second, time.Since(start))
}

func TestRunner_MissingBinary(t *testing.T) {
	r := &zfs.Runner{ZFS: "/nonexistent/zfs"}
	_, err := r.ZFSCmd(context.Background(), "list")
	must.ErrorIs(t, err, zfs.ErrUnavailable)
}

func TestRunner_StderrKeptApart(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "fakezfs")
	must.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho out\necho 'cannot open x: dataset does not exist' >&2\nexit 1\n"), 0o755))
	r := &zfs.Runner{ZFS: fake}
	out, err := r.ZFSCmd(context.Background(), "get")
	must.ErrorIs(t, err, zfs.ErrNotExist)
	must.Eq(t, "out\n", string(out))
	var zerr *zfs.Error
	must.True(t, errors.As(err, &zerr))
	must.Eq(t, "cannot open x: dataset does not exist", zerr.Stderr)
	must.Eq(t, []string{fake, "get"}, zerr.Args)
}

// startHolder starts a process whose working directory is dir and stops it
// (by its PID) at cleanup.
func startHolder(t *testing.T, dir string) *os.Process {
	t.Helper()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Dir: dir})
	must.NoError(t, err)
	t.Cleanup(func() { _ = p.Kill(); _, _ = p.Wait() })
	return p
}
