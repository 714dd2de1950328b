package zfs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// gateHelperEnv switches the test binary into runAsGateHelper (see
// TestMain); its value is a gateHelper as JSON.
const gateHelperEnv = "NDZ_ZFS_TEST_GATE_HELPER"

// gateHelper is what the helper process runs: one zfs command through a
// Runner, with the gate on as on zfs-fuse, its lease and its lock file.
type gateHelper struct {
	Lock  string
	Lease time.Duration
	Args  []string
}

// runAsGateHelper plays another process of the machine that runs this
// package (the operator CLI, a second agent's plugin): it runs the
// command and exits 0 when it succeeded.
func runAsGateHelper() int {
	var h gateHelper
	if err := json.Unmarshal([]byte(os.Getenv(gateHelperEnv)), &h); err != nil {
		fmt.Fprintf(os.Stderr, "gate helper: %v\n", err)
		return 2
	}
	zfs.UseGate(h.Lease, h.Lock)
	if _, err := (&zfs.Runner{}).ZFSCmd(context.Background(), h.Args...); err != nil {
		fmt.Fprintf(os.Stderr, "gate helper: %v\n", err)
		return 1
	}
	return 0
}

// startGateHelper starts the helper process on h, and returns it and a
// channel with its outcome (nil when it exited 0). The process is killed,
// and waited for, when the test ends if it still runs.
func startGateHelper(t *testing.T, h gateHelper) (*exec.Cmd, <-chan error) {
	t.Helper()
	self, err := os.Executable()
	must.NoError(t, err)
	spec, err := json.Marshal(h)
	must.NoError(t, err)
	var stderr bytes.Buffer
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), gateHelperEnv+"="+string(spec))
	cmd.Stderr = &stderr
	must.NoError(t, cmd.Start())
	done := make(chan error, 1)
	var once sync.Once
	wait := func() {
		once.Do(func() {
			err := cmd.Wait()
			if err != nil {
				err = fmt.Errorf("%w: %s", err, stderr.String())
			}
			done <- err
		})
	}
	go wait()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a test that stopped it
		_ = cmd.Process.Kill()
		wait()
	})
	return cmd, done
}

// On zfs-fuse the processes of the machine that run this package take
// turns through the lock file too: a create in this process waits for an
// unmount another process runs (the helper: the test binary run again),
// for that process's lease; when that process is stopped while it holds
// its turn, this one goes on after its own lease, and says so; without a
// lock file it can open, a process keeps to its own gate. The real zfs
// runs behind a wrapper that pauses the helper's unmount.
func TestRunner_MountsOneAtATimeAcrossProcesses(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	cases := []struct {
		name string
		// lock is the lock file both processes use, "" for one in the
		// test's own directory.
		lock string
		// stop: the helper is stopped (SIGSTOP) once its unmount waits,
		// so that its own lease never ends its turn.
		stop  bool
		lease time.Duration // this process's
		waits bool
	}{
		{name: "a create waits for another process's unmount", lease: time.Minute, waits: true},
		{name: "a stopped process holds the others for their lease only", stop: true, lease: 1500 * time.Millisecond},
		{name: "without a lock file each process keeps to its own gate", lock: "/nonexistent/nomad-device-zfs.lock", lease: time.Minute},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lock := tc.lock
			if lock == "" {
				lock = filepath.Join(t.TempDir(), "mounts.lock")
			}
			zfs.SetMountsOneAtATime(t, true)
			zfs.SetMountLease(t, tc.lease)
			zfs.SetMountLockPath(t, lock)
			a, b := pool.Dataset(fmt.Sprintf("xgate-a%d", i)), pool.Dataset(fmt.Sprintf("xgate-b%d", i))
			pool.ZFS(t, "create", a)
			w.PauseFor("unmount", a)
			t.Cleanup(func() { w.Resume("unmount") })
			helper, first := startGateHelper(t, gateHelper{Lock: lock, Lease: time.Minute, Args: []string{"unmount", a}})
			w.WaitPaused(t, "unmount", 30*time.Second)
			if tc.stop {
				must.NoError(t, helper.Process.Signal(syscall.SIGSTOP))
			}

			logger, logs := warnings()
			args := []string{"create", b}
			second := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := (&zfs.Runner{Logger: logger}).ZFSCmd(context.Background(), args...)
				second <- err
			}()
			if tc.waits {
				mustWaitForResume(t, w, "unmount", first, second, args)
				return
			}
			mustGoOn(t, "unmount", second, args)
			took := time.Since(start)
			must.Eq(t, "unmount", w.WaitPaused(t, "unmount", time.Second)[0], must.Sprint("the helper's unmount is still paused"))
			logged := logs()
			if tc.stop {
				must.GreaterEq(t, tc.lease, took, must.Sprint("the create waited for its lease"))
				must.StrContains(t, logged, "another process's zfs command that mounts or unmounts holds its turn past its lease", must.Sprint("the lapse of the other process's turn is logged"))
				must.NoError(t, helper.Process.Signal(syscall.SIGCONT))
			} else {
				must.Less(t, time.Second, took, must.Sprint("the create did not wait"))
				must.Eq(t, "", logged)
			}
			w.Resume("unmount")
			must.NoError(t, <-first)
		})
	}
}

// lockMachine takes the lock at once when nobody holds it, waits for its
// lease at most (past) when another open file of it holds it, gives up
// when its context ends first, and does without a file it cannot open.
// A second open file in this process holds the lock as another process's
// would (flock locks belong to the open file).
func TestLockMachine(t *testing.T) {
	cases := []struct {
		name     string
		held     bool // another open file holds the lock
		missing  bool // the lock's directory does not exist
		cancel   bool // the context ends before the lease
		wantFile bool
		wantPast bool
		wantErr  bool
		atLeast  time.Duration
	}{
		{name: "free", wantFile: true},
		{name: "held past the lease", held: true, wantPast: true, atLeast: 300 * time.Millisecond},
		{name: "held, the context ends first", held: true, cancel: true, wantErr: true},
		{name: "no file to lock", missing: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mounts.lock")
			if tc.missing {
				path = filepath.Join(t.TempDir(), "gone", "mounts.lock")
			}
			zfs.SetMountLockPath(t, path)
			if tc.held {
				other, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
				must.NoError(t, err)
				t.Cleanup(func() { other.Close() })
				must.NoError(t, syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			start := time.Now()
			f, past, err := zfs.LockMachine(ctx, 300*time.Millisecond)
			took := time.Since(start)
			if f != nil {
				t.Cleanup(func() { f.Close() })
			}
			must.Eq(t, tc.wantFile, f != nil)
			must.Eq(t, tc.wantPast, past)
			must.Eq(t, tc.wantErr, err != nil, must.Sprintf("error %v", err))
			must.GreaterEq(t, tc.atLeast, took)
			if tc.cancel {
				must.ErrorIs(t, err, context.Canceled)
				must.Less(t, 300*time.Millisecond, took, must.Sprint("gave up with its context, before the lease"))
			}
			if f != nil {
				// Held now: another open file cannot take it.
				other, err := os.OpenFile(path, os.O_RDWR, 0)
				must.NoError(t, err)
				defer other.Close()
				must.ErrorIs(t, syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), syscall.EWOULDBLOCK)
			}
		})
	}
}
