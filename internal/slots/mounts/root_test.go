package mounts

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// TestMain starts the zfs-fuse daemon the pools of these tests need.
func TestMain(m *testing.M) { zfstest.Main(m) }

// resumeLater starts, outside this test binary (its own process group), a
// shell that sends SIGCONT to pid after d: a daemon this test stops runs
// again even when the test binary dies meanwhile (its -timeout, a panic,
// a signal). The shell is stopped by its PID when the test ends.
func resumeLater(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("sleep %d; kill -CONT %d", int(d.Seconds()), pid))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the shell and its sleep
		_ = cmd.Wait()
	})
}

// TestRoot_AHungFuseDaemonIsABoundedWait: with the zfs-fuse daemon that
// serves the pool stopped (SIGSTOP: a daemon that no longer answers), a
// look into a dataset's mounted root, as a slot's lock holder makes it
// (adopting an armed spare, readying a root), gives up after RootTimeout;
// the next look at the same root fails at once rather than leaving
// another goroutine behind; and once the daemon answers again, so does
// the root. Only a daemon this test binary started is stopped. On the
// kernel module there is no daemon to stop: the test then checks only
// that the bounded look answers, and logs so.
func TestRoot_AHungFuseDaemonIsABoundedWait(t *testing.T) {
	p := zfstest.NewPool(t, 0)
	ds := p.Dataset("root")
	p.ZFS(t, "create", ds)
	dir := p.Prop(t, ds, "mountpoint")
	empty, err := EmptyDir(context.Background(), dir)
	must.NoError(t, err)
	must.True(t, empty)

	pid := zfstest.StartedDaemon()
	if pid == 0 {
		if _, err := os.Stat("/dev/zfs"); err == nil {
			t.Log("ZFS is the kernel module: no daemon to stop; the bounded look answers")
			must.NoError(t, EnsureRoot(context.Background(), dir, 0, 0, 0o755))
			return
		}
		testenv.Skip(t, "the zfs-fuse daemon was not started by this test binary: stopping it would stop someone else's")
	}

	old := RootTimeout
	RootTimeout = time.Second
	t.Cleanup(func() { RootTimeout = old })
	resumeLater(t, pid, 15*time.Second) // before the stop: whatever becomes of this binary
	must.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	waitStopped(t, pid) // kill returns before every thread has stopped
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			must.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
		}
	}
	t.Cleanup(resume) // before the pool's own cleanup, which needs the daemon

	began := time.Now()
	_, err = EmptyDir(context.Background(), dir)
	took := time.Since(began)
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.Less(t, 5*time.Second, took, must.Sprint("the look waited for the daemon"))

	began = time.Now()
	err = EnsureRoot(context.Background(), dir, 0, 0, 0o755)
	must.ErrorIs(t, err, hostfs.ErrStuck)
	must.Less(t, 100*time.Millisecond, time.Since(began))

	resume()
	deadline := time.Now().Add(30 * time.Second)
	for {
		empty, err = EmptyDir(context.Background(), dir)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	must.NoError(t, err)
	must.True(t, empty)
	must.NoError(t, EnsureRoot(context.Background(), dir, 0, 0, 0o755))
}

// waitStopped returns once every thread of process pid is stopped (state
// T in its stat), for up to 10 s: a thread still running would answer a
// look the test means to hang.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		must.NoError(t, err)
		stopped := 0
		for _, task := range tasks {
			if _, f, err := localagent.ProcStat(fmt.Sprintf("/proc/%d/task/%s", pid, task.Name())); err == nil && len(f) > 0 && (f[0] == "T" || f[0] == "t") {
				stopped++
			}
		}
		if stopped == len(tasks) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d threads of pid %d stopped after 10 s", stopped, len(tasks), pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
