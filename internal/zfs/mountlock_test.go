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
//   - when the helper is stopped while it holds the turn, its stamp ages
//     past its lease, and the create goes on beside it and says so;
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
		unusable bool
		// helperLease is the helper's; stop: the helper is stopped
		// (SIGSTOP) once its unmount waits, so that its lease's timer
		// never gives the turn back.
		helperLease time.Duration
		stop        bool
		// waits: the create waits until the unmount is resumed; else it
		// goes on after at least after, with logged (or nothing) here.
		waits  bool
		after  time.Duration
		logged string
	}{
		{name: "a create waits for another process at work, past its own lease", helperLease: time.Minute, waits: true},
		{name: "another process gives the turn back at its lease", helperLease: 500 * time.Millisecond, after: 500 * time.Millisecond},
		{name: "a stopped process's turn is gone beside after its lease", helperLease: 300 * time.Millisecond, stop: true, after: 800 * time.Millisecond,
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
			zfs.ForgetLockNote(t)
			a, b := pool.Dataset(fmt.Sprintf("xgate-a%d", i)), pool.Dataset(fmt.Sprintf("xgate-b%d", i))
			pool.ZFS(t, "create", a)
			w.PauseFor("unmount", a)
			t.Cleanup(func() { w.Resume("unmount") })
			helper, first := startGateHelper(t, gateHelper{Lock: lock, Lease: tc.helperLease, Args: []string{"unmount", a}})
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
			must.GreaterEq(t, tc.after, took)
			if tc.after == 0 {
				must.Less(t, time.Second, took, must.Sprint("the create did not wait"))
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

// lockMachine takes the turn at once when nobody holds it, and stamps it;
// waits while the holder's stamp says it is at work, however long a
// succession of holders keeps it; goes beside a holder whose stamp is past
// its lease (or blank past this process's); gives up when its context
// ends; and does without a lock file in a directory others may write, or
// behind a link. A second open file of the lock, in this process, holds
// the turn as another process's would (flock locks belong to the open
// file); the test writes its stamp.
func TestLockMachine(t *testing.T) {
	type holder struct {
		stamp func() []byte    // written at the start, made then; nil: none (blank)
		then  func(f *os.File) // what the holder does next, in a goroutine of its own (nil: nothing)
	}
	// fresh is a stamp taken when it is written, old one taken ago then.
	fresh := func(lease time.Duration) func() []byte { return func() []byte { return zfs.Stamp(4242, 0, lease) } }
	old := func(ago, lease time.Duration) func() []byte {
		return func() []byte { return zfs.Stamp(4242, ago, lease) }
	}
	cases := []struct {
		name     string
		holder   *holder
		setup    func(t *testing.T, dir, path string)
		cancel   time.Duration // the context ends after this (0: never)
		want     string        // held, stuck, unusable, canceled
		atLeast  time.Duration
		lessThan time.Duration
	}{
		{name: "free", want: "held", lessThan: time.Second},
		{name: "a holder at work, until the context ends", holder: &holder{stamp: fresh(time.Minute)}, cancel: 1500 * time.Millisecond,
			want: "canceled", atLeast: 1500 * time.Millisecond},
		{name: "a holder that gives it back", holder: &holder{stamp: fresh(time.Minute), then: func(f *os.File) {
			time.Sleep(400 * time.Millisecond)
			_, _ = f.WriteAt(make([]byte, zfs.StampSize), 0)
			f.Close()
		}}, want: "held", atLeast: 400 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "holders after holders, past this process's lease", holder: &holder{stamp: fresh(time.Second), then: func(f *os.File) {
			// Each stamp a new holder's, younger than its lease: the
			// turn stays held, at work, for 3 s in all.
			for range 6 {
				time.Sleep(500 * time.Millisecond)
				_, _ = f.WriteAt(fresh(time.Second)(), 0)
			}
			_, _ = f.WriteAt(make([]byte, zfs.StampSize), 0)
			f.Close()
		}}, want: "held", atLeast: 3 * time.Second, lessThan: 20 * time.Second},
		{name: "a holder past its lease", holder: &holder{stamp: old(10*time.Second, time.Second)}, want: "stuck", lessThan: time.Second},
		{name: "a holder whose lease runs out while it is held", holder: &holder{stamp: fresh(300 * time.Millisecond)},
			want: "stuck", atLeast: 800 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "a blank stamp, past this process's lease", holder: &holder{}, want: "stuck", atLeast: 800 * time.Millisecond, lessThan: 10 * time.Second},
		{name: "a directory others may write", setup: func(t *testing.T, dir, _ string) { must.NoError(t, os.Chmod(dir, 0o777)) }, want: "unusable"},
		{name: "a link in the file's place", setup: func(t *testing.T, dir, path string) {
			must.NoError(t, os.Symlink(filepath.Join(dir, "elsewhere"), path))
		}, want: "unusable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "lock")
			must.NoError(t, os.Mkdir(dir, 0o700))
			path := filepath.Join(dir, "mounts.lock")
			zfs.SetMountLockPath(t, path)
			zfs.SetMountLease(t, 300*time.Millisecond)
			if tc.setup != nil {
				tc.setup(t, dir, path)
			}
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
			start := time.Now()
			held, stamp, stuck, unusable, err := zfs.LockMachine(ctx)
			took := time.Since(start)
			got := "held"
			switch {
			case err != nil:
				must.ErrorIs(t, err, context.Canceled)
				got = "canceled"
			case stuck:
				got = "stuck"
			case unusable != nil:
				got = "unusable"
			case !held:
				got = "nothing"
			}
			must.Eq(t, tc.want, got, must.Sprintf("got %s, unusable: %v", got, unusable))
			must.GreaterEq(t, tc.atLeast, took)
			if tc.lessThan > 0 {
				must.Less(t, tc.lessThan, took)
			}
			if held {
				pid, _, lease, ok := zfs.ParseStamp(stamp)
				must.True(t, ok, must.Sprintf("stamp %q", stamp))
				must.Eq(t, os.Getpid(), pid)
				must.Eq(t, 300*time.Millisecond, lease)
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
