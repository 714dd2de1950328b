package zfs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
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
	// Killed with this test binary, even stopped, should its cleanups
	// never run (a -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
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
// turns through the lock file too, with the helper (the test binary run
// again) as the other process, running an unmount that a wrapper pauses:
//   - a create here waits for it as long as it is at work, past this
//     process's own lease;
//   - it goes on when the helper's own lease gives the turn back, and
//     nothing is logged here;
//   - when the helper is stopped with a stamp past its lease, the create
//     goes on beside it and says so;
//   - without a usable lock file each process keeps to its own turns,
//     and says so.
func TestRunner_MountsOneAtATimeAcrossProcesses(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	cases := []struct {
		name string
		// unusable: the lock's directory may be written by others, so
		// neither process uses it.
		unusable    bool
		helperLease time.Duration
		// stop: the helper is stopped (SIGSTOP) once its unmount waits,
		// and its stamp made as old as a holder stuck a minute past its
		// lease, so that only the stamp tells.
		stop bool
		// waits: the create waits until the unmount is resumed; else it
		// goes on, with logged (or nothing) here.
		waits  bool
		logged string
	}{
		{name: "a create waits for another process at work, past its own lease", helperLease: time.Minute, waits: true},
		{name: "another process gives the turn back at its lease", helperLease: 500 * time.Millisecond},
		{name: "a stopped process's turn is gone beside", helperLease: time.Minute, stop: true,
			logged: "another process holds the machine's turn for commands that mount or unmount past its lease"},
		{name: "without a usable lock each process keeps to its own turns", unusable: true, helperLease: time.Minute,
			logged: "commands that mount or unmount take turns within this process only"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "lock")
			must.NoError(t, os.Mkdir(dir, 0o700))
			if tc.unusable {
				must.NoError(t, os.Chmod(dir, 0o777))
			}
			lock := filepath.Join(dir, "mounts.lock")
			zfs.SetMountsOneAtATime(t, true)
			zfs.SetMountLease(t, time.Second) // this process's: shorter than the helper's work
			zfs.SetMountLockPath(t, lock)
			zfs.ForgetLockNotes(t)
			a, b := pool.Dataset(fmt.Sprintf("xgate-a%d", i)), pool.Dataset(fmt.Sprintf("xgate-b%d", i))
			pool.ZFS(t, "create", a)
			w.PauseFor("unmount", a)
			t.Cleanup(func() { w.Resume("unmount") })
			helper, first := startGateHelper(t, gateHelper{Lock: lock, Lease: tc.helperLease, Args: []string{"unmount", a}})
			w.WaitPaused(t, "unmount", 30*time.Second)
			var taken time.Duration // when the helper took its turn (its stamp)
			if !tc.unusable {
				held, err := os.ReadFile(lock)
				must.NoError(t, err)
				pid, at, lease, ok := zfs.ParseStamp(string(held))
				must.True(t, ok, must.Sprintf("the helper's stamp %q", held))
				must.Eq(t, helper.Process.Pid, pid)
				must.Eq(t, tc.helperLease, lease)
				taken = at
			}
			if tc.stop {
				must.NoError(t, helper.Process.Signal(syscall.SIGSTOP))
				f, err := os.OpenFile(lock, os.O_WRONLY, 0)
				must.NoError(t, err)
				_, err = f.WriteAt(zfs.Stamp(helper.Process.Pid, 2*time.Minute, time.Minute), 0)
				must.NoError(t, err)
				must.NoError(t, f.Close())
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
				select {
				case err := <-second:
					t.Fatalf("%q ran while the other process's unmount was paused (err %v)", args, err)
				case <-time.After(3 * time.Second): // three of this process's leases
				}
				must.False(t, ran(w, args), must.Sprintf("%q started before the unmount ended", args))
				must.Eq(t, "", logs())
				w.Resume("unmount")
				must.NoError(t, <-first)
				must.NoError(t, <-second)
				return
			}
			mustGoOn(t, "unmount", second, args)
			took := time.Since(start)
			must.Eq(t, "unmount", w.WaitPaused(t, "unmount", time.Second)[0], must.Sprint("the helper's unmount is still paused"))
			switch {
			case tc.stop:
				must.GreaterEq(t, 500*time.Millisecond, took, must.Sprint("a stale stamp is looked at for half a second first"))
			case tc.unusable:
				must.Less(t, time.Second, took, must.Sprint("the create did not wait"))
			default:
				must.GreaterEq(t, taken+tc.helperLease, zfs.BootNow(), must.Sprint("the create went on once the helper's lease gave the turn back"))
			}
			if tc.logged == "" {
				must.Eq(t, "", logs())
			} else {
				must.StrContains(t, logs(), tc.logged)
			}
			if tc.stop {
				must.NoError(t, helper.Process.Signal(syscall.SIGCONT))
			}
			w.Resume("unmount")
			must.NoError(t, <-first)
		})
	}
}

// deadPID returns the PID of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	must.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// lockMachine takes the turn at once when nobody holds it, and stamps it;
// waits while the holder is at work, however long a succession of holders
// keeps it, and while a holder that took the turn after a dead one has
// not stamped it yet; goes beside a live holder whose stamp stays past its
// lease for half a second (at once for the next command, which is not told
// anew), or a stamp blank past this process's lease; gives up when its
// context ends; does without a lock file in a directory others may write,
// behind a link, or in a directory that is one; and makes the file its
// user's alone. A second open file of the lock, in this process, holds the
// turn as another process's would (flock locks belong to the open file);
// the test writes its stamp.
func TestLockMachine(t *testing.T) {
	self := os.Getpid() // a live holder's PID
	type holder struct {
		stamp func() []byte    // written at the start, made then; nil: none (blank)
		then  func(f *os.File) // what the holder does next, in a goroutine of its own (nil: nothing)
	}
	fresh := func(lease time.Duration) func() []byte { return func() []byte { return zfs.Stamp(self, 0, lease) } }
	old := func(pid int, ago, lease time.Duration) func() []byte {
		return func() []byte { return zfs.Stamp(pid, ago, lease) }
	}
	giveBack := func(f *os.File) {
		_, _ = f.WriteAt(make([]byte, zfs.StampSize), 0)
		f.Close()
	}
	cases := []struct {
		name     string
		holder   *holder
		setup    func(t *testing.T, dir, path string)
		cancel   time.Duration // the context ends after this (0: never)
		again    bool          // a second call, once the first found the holder stuck
		want     string        // held, stuck, unusable, canceled
		atLeast  time.Duration
		lessThan time.Duration
	}{
		{name: "free", want: "held", lessThan: time.Second},
		{name: "a holder at work, until the context ends", holder: &holder{stamp: fresh(time.Minute)}, cancel: 1500 * time.Millisecond,
			want: "canceled", atLeast: 1500 * time.Millisecond},
		{name: "a holder that gives it back", holder: &holder{stamp: fresh(time.Minute), then: func(f *os.File) {
			time.Sleep(400 * time.Millisecond)
			giveBack(f)
		}}, want: "held", atLeast: 400 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "holders after holders, past this process's lease", holder: &holder{stamp: fresh(time.Second), then: func(f *os.File) {
			// Each stamp a new holder's, younger than its lease: the
			// turn stays held, at work, for 3 s in all.
			for range 6 {
				time.Sleep(500 * time.Millisecond)
				_, _ = f.WriteAt(fresh(time.Second)(), 0)
			}
			giveBack(f)
		}}, want: "held", atLeast: 3 * time.Second, lessThan: 20 * time.Second},
		{name: "a holder after a dead one, slow to stamp", setup: func(t *testing.T, _, path string) {
			// The dead holder's stamp, long past its lease, left behind.
			must.NoError(t, os.WriteFile(path, old(deadPID(t), time.Minute, time.Second)(), 0o600))
		}, holder: &holder{then: func(f *os.File) {
			time.Sleep(100 * time.Millisecond)
			_, _ = f.WriteAt(fresh(time.Minute)(), 0)
			time.Sleep(1500 * time.Millisecond)
			giveBack(f)
		}}, want: "held", atLeast: 1600 * time.Millisecond, lessThan: 20 * time.Second},
		{name: "a live holder past its lease", holder: &holder{stamp: old(self, 10*time.Second, time.Second)}, want: "stuck", atLeast: 500 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "the same holder for the next command", holder: &holder{stamp: old(self, 10*time.Second, time.Second)}, again: true, want: "stuck", lessThan: 200 * time.Millisecond},
		{name: "a holder whose lease runs out while it is held", holder: &holder{stamp: fresh(300 * time.Millisecond)},
			want: "stuck", atLeast: 800 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "a blank stamp, past this process's lease", holder: &holder{}, want: "stuck", atLeast: 800 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "a directory others may write", setup: func(t *testing.T, dir, _ string) { must.NoError(t, os.Chmod(dir, 0o777)) }, want: "unusable"},
		{name: "a link in the file's place", setup: func(t *testing.T, dir, path string) {
			must.NoError(t, os.Symlink(filepath.Join(dir, "elsewhere"), path))
		}, want: "unusable"},
		{name: "a link in the directory's place", setup: func(t *testing.T, dir, _ string) {
			must.NoError(t, os.Remove(dir))
			must.NoError(t, os.Symlink(t.TempDir(), dir))
		}, want: "unusable"},
		{name: "a file others may read", setup: func(t *testing.T, _, path string) {
			must.NoError(t, os.WriteFile(path, nil, 0o644))
			must.NoError(t, os.Chmod(path, 0o644))
		}, want: "held"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "lock")
			must.NoError(t, os.Mkdir(dir, 0o700))
			path := filepath.Join(dir, "mounts.lock")
			zfs.SetMountLockPath(t, path)
			zfs.SetMountLease(t, 300*time.Millisecond)
			zfs.ForgetLockNotes(t)
			if tc.setup != nil {
				tc.setup(t, dir, path)
			}
			// The lower bounds count from the holder's stamp and its
			// first step, the upper ones from the call.
			setUp := time.Now()
			if h := tc.holder; h != nil {
				f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
				must.NoError(t, err)
				t.Cleanup(func() { f.Close() })
				must.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
				if h.stamp != nil {
					_, err := f.WriteAt(h.stamp(), 0)
					must.NoError(t, err)
				}
				if h.then != nil {
					go h.then(f)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel > 0 {
				time.AfterFunc(tc.cancel, cancel)
			}
			if tc.again {
				first, err := zfs.LockMachine(ctx)
				must.NoError(t, err)
				must.True(t, first.Stuck && first.Newly, must.Sprintf("first call: %+v", first))
			}
			start := time.Now()
			turn, err := zfs.LockMachine(ctx)
			took := time.Since(start)
			got := "held"
			switch {
			case err != nil:
				must.ErrorIs(t, err, context.Canceled)
				got = "canceled"
			case turn.Stuck:
				got = "stuck"
				must.Eq(t, !tc.again, turn.Newly, must.Sprint("a holder found stuck is told once"))
			case turn.Unusable != nil:
				got = "unusable"
			case !turn.Held:
				got = "nothing"
			}
			must.Eq(t, tc.want, got, must.Sprintf("got %s, unusable: %v", got, turn.Unusable))
			must.GreaterEq(t, tc.atLeast, time.Since(setUp))
			if tc.lessThan > 0 {
				must.Less(t, tc.lessThan, took)
			}
			if turn.Held {
				pid, _, lease, ok := zfs.ParseStamp(turn.Stamp)
				must.True(t, ok, must.Sprintf("stamp %q", turn.Stamp))
				must.Eq(t, os.Getpid(), pid)
				must.Eq(t, 300*time.Millisecond, lease)
				st, err := os.Stat(path)
				must.NoError(t, err)
				must.Eq(t, os.FileMode(0o600), st.Mode().Perm(), must.Sprint("the file is its user's alone"))
			}
		})
	}
}

func TestParseStamp(t *testing.T) {
	cases := []struct {
		in       string
		ok       bool
		pid      int
		taken, l time.Duration
	}{
		{in: "12 3400 5600" + strings.Repeat(" ", 52), ok: true, pid: 12, taken: 3400, l: 5600},
		{in: string(make([]byte, 64))},      // blank: nobody holds it
		{in: "12 3400\x00\x00\x00\x00\x00"}, // a read beside a write
		{in: "12 34\x0000 5600"},
		{in: "12 -1 5600"},
		{in: "12 3400 5600 7"},
		{in: ""},
	}
	for _, tc := range cases {
		pid, taken, lease, ok := zfs.ParseStamp(tc.in)
		must.Eq(t, tc.ok, ok, must.Sprintf("%q", tc.in))
		if tc.ok {
			must.Eq(t, tc.pid, pid)
			must.Eq(t, tc.taken, taken)
			must.Eq(t, tc.l, lease)
		}
	}
}
