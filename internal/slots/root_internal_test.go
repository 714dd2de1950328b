package slots

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// fuseDaemon returns the PID of the zfs-fuse daemon that serves the
// pool's mounts (the one process whose executable is zfs-fuse), or 0 on
// the kernel module, which has no daemon to hang.
func fuseDaemon(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && filepath.Base(exe) == "zfs-fuse" {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		_, err := os.Stat("/dev/zfs")
		must.NoError(t, err, must.Sprint("neither a zfs-fuse daemon nor the kernel module"))
		return 0
	}
	must.SliceLen(t, 1, pids, must.Sprint("zfs-fuse daemons"))
	return pids[0]
}

// TestRoot_AHungFuseDaemonIsABoundedWait (zfs-fuse): with the daemon
// stopped (SIGSTOP: a daemon that no longer answers), a look into a
// dataset's mounted root, as a slot's lock holder makes it (adopting an
// armed spare, readying a root), gives up after rootTimeout; the next look
// at the same root fails at once rather than leaving another goroutine
// behind; and once the daemon answers again, so does the root.
func TestRoot_AHungFuseDaemonIsABoundedWait(t *testing.T) {
	p := zfstest.NewPool(t, 0)
	pid := fuseDaemon(t)
	ds := p.Dataset("root")
	p.ZFS(t, "create", ds)
	dir := p.Prop(t, ds, "mountpoint")
	empty, err := emptyDir(dir)
	must.NoError(t, err)
	must.True(t, empty)

	if pid == 0 {
		// The kernel module: a mount answers without a daemon, and
		// nothing can be stopped to make it hang. The bounded look
		// answers as it does.
		must.NoError(t, ensureRoot(dir, 0, 0, 0o755))
		return
	}

	old := rootTimeout
	rootTimeout = time.Second
	t.Cleanup(func() { rootTimeout = old })
	must.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	// Whatever becomes of this test, the daemon runs again within 15 s:
	// every other test of the run needs it.
	watchdog := time.AfterFunc(15*time.Second, func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	t.Cleanup(func() { watchdog.Stop() })
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			must.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
		}
	}
	t.Cleanup(resume) // before the pool's own cleanup, which needs the daemon

	began := time.Now()
	_, err = emptyDir(dir)
	took := time.Since(began)
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.Less(t, 5*time.Second, took, must.Sprint("the look waited for the daemon"))

	began = time.Now()
	err = ensureRoot(dir, 0, 0, 0o755)
	must.ErrorIs(t, err, hostfs.ErrStuck)
	must.Less(t, 100*time.Millisecond, time.Since(began))

	resume()
	deadline := time.Now().Add(30 * time.Second)
	for {
		empty, err = emptyDir(dir)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	must.NoError(t, err)
	must.True(t, empty)
	must.NoError(t, ensureRoot(dir, 0, 0, 0o755))
}
