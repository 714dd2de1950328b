package zfs

// The machine's turn: on zfs-fuse the daemon is one for the whole machine,
// so the processes that run this package (the plugin, its operator CLI,
// whose prune destroys archives, the plugin of a second agent on the
// machine, the tests) take turns for the commands that mount or unmount
// through an exclusive flock on one file. The holder writes a stamp at the
// start of the file (its PID, when it took the turn and its lease) right
// after it takes the turn, and clears it before it gives the turn back, so
// that a waiter can tell a holder at work, however long it and the holders
// after it keep the turn, from one stuck past its lease (stopped, say),
// beside which it goes on as within a process (mountLease). A process that
// dies gives the lock back with its file, and leaves its stamp: a dead
// process's stamp is read as blank, the next holder's own to come. Going
// beside a stuck holder ends the turns between the processes that do so,
// as a lapse does within one, until that holder is gone. The wait is not
// a queue: a process whose commands follow one another closely may keep
// another waiting, up to that one's command timeout. The directory is
// root's alone: a user who could make or open the file could hold the
// turn, and every release, for good.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// mountLockPath is the machine's lock file. A variable for the tests.
var mountLockPath = "/run/nomad-device-zfs/zfs-fuse-mounts.lock"

// stampSize is the length of the holder's stamp at the start of the lock
// file: "<pid> <taken> <lease>" (CLOCK_BOOTTIME and a duration, in ns),
// padded with spaces, or all zeros while nobody holds the turn.
const stampSize = 64

// stuckMargin is how long past a holder's own lease a waiter still waits
// for it: the lease's timer may fire late on a loaded machine.
const stuckMargin = 500 * time.Millisecond

// machineTurn is what lockMachine got: the turn (lock), or leave to go on
// without it, because its holder is stuck (stuck; newly when this wait is
// the first to find that holder so) or the lock file cannot be used
// (unusable).
type machineTurn struct {
	lock     *machineLock
	stuck    bool
	newly    bool
	unusable error
}

// machineLock is the open lock file of a turn this process holds.
type machineLock struct{ f *os.File }

// release clears the stamp and gives the turn back; a nil lock (no turn
// held) does nothing.
func (l *machineLock) release() {
	if l == nil {
		return
	}
	_, _ = l.f.WriteAt(make([]byte, stampSize), 0)
	l.f.Close() // this process's only descriptor of it: the flock goes with it
}

// stuckHolder is the stamp of the holder this process last found stuck,
// and the file it holds, so that the commands after the first go beside
// it at once, for as long as that same stamp is there. Only the holder of
// mountGate reads or writes it.
var stuckHolder struct {
	ino   uint64
	stamp holderStamp
}

// lockMachine takes the machine's turn for a command about to run. It
// waits while another process holds it and is at work, and returns a turn
// to release when the command ends, or one without a lock to go on beside
// a stuck holder or without a usable lock file. A holder is stuck when the
// same stamp, of a live process, has been there past its lease by
// stuckMargin, and seen so for stuckMargin; or when the stamp has been
// blank, or a dead process's, for this process's mountLease and
// stuckMargin (a holder that has not written its stamp yet writes it
// right after it takes the turn; a process that died gave the turn back
// with it). It returns an error only when ctx is done first. The file is
// opened close-on-exec, so no zfs child keeps the turn. Only one
// goroutine of a process calls it at a time (under mountGate).
func lockMachine(ctx context.Context) (machineTurn, error) {
	var seen holderStamp // the stamp of the latest look (zero: blank)
	var since time.Time  // since when the looks have found seen
	for attempt := 0; ; attempt++ {
		f, err := openMachineLock()
		if err != nil {
			return machineTurn{unusable: err}, nil
		}
		ino := inode(f)
		pause := time.Millisecond
		for {
			err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
				f.Close()
				return machineTurn{unusable: fmt.Errorf("locking %s: %w", mountLockPath, err)}, nil
			}
			if ctx.Err() != nil {
				f.Close()
				return machineTurn{}, ctx.Err()
			}
			h, ok := readStamp(f)
			if ok && !alive(h.pid) {
				// Its holder died, which gave the turn back: the stamp
				// is the one before the holder now, which has not
				// written its own yet.
				h, ok = holderStamp{}, false
			}
			if h != seen || since.IsZero() {
				seen, since = h, time.Now()
			}
			switch {
			case ok && stuckHolder.ino == ino && stuckHolder.stamp == h:
				f.Close()
				return machineTurn{stuck: true}, nil
			case ok && past(bootNow()-h.taken, h.lease) && time.Since(since) >= stuckMargin:
				stuckHolder.ino, stuckHolder.stamp = ino, h
				f.Close()
				return machineTurn{stuck: true, newly: true}, nil
			case !ok && time.Since(since) > mountLease+stuckMargin:
				f.Close()
				return machineTurn{stuck: true, newly: true}, nil
			}
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				f.Close()
				return machineTurn{}, ctx.Err()
			case <-t.C:
			}
			pause = min(2*pause, 10*time.Millisecond)
		}
		// First the stamp, so that no waiter reads the one before it
		// (a dead holder's) for long; a write that fails leaves the turn
		// held all the same, a blank stamp to the waiters.
		stamp := fmt.Sprintf("%d %d %d", os.Getpid(), bootNow(), mountLease)
		_, _ = f.WriteAt([]byte(stamp+strings.Repeat(" ", stampSize-len(stamp))), 0)
		// The file may have been removed, and made again, since it was
		// opened: this lock would then guard nothing.
		if same, err := stillAtPath(f); err != nil || !same {
			f.Close()
			if attempt < 3 {
				continue
			}
			return machineTurn{unusable: fmt.Errorf("%s keeps being replaced while it is locked", mountLockPath)}, nil
		}
		return machineTurn{lock: &machineLock{f: f}}, nil
	}
}

// past reports whether a holder that took its turn age ago is past its
// lease by stuckMargin (without overflow, whatever a stamp says).
func past(age, lease time.Duration) bool {
	return age > lease && age-lease > stuckMargin
}

// alive reports whether process pid exists (signal 0: EPERM is a process
// of another user).
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// inode returns the inode of f, 0 when it cannot be read.
func inode(f *os.File) uint64 {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	return st.Ino
}

// openMachineLock opens the lock file, making its directory (root's
// alone) when needed. It refuses a directory anyone else may write, and a
// file that is a link or not this user's, and makes the file this user's
// alone: any of them would let another user hold the turn.
func openMachineLock() (*os.File, error) {
	dir := filepath.Dir(mountLockPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("%s is not a directory that only this user (uid %d) may write", dir, os.Geteuid())
	}
	f, err := os.OpenFile(mountLockPath, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", mountLockPath, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file of this user (uid %d)", mountLockPath, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		// Anyone who may open it may lock it (a read-only descriptor
		// will do), and hold every other process's turn.
		if err := unix.Fchmod(int(f.Fd()), 0o600); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: making it this user's alone: %w", mountLockPath, err)
		}
	}
	return f, nil
}

// stillAtPath reports whether f is still the file at mountLockPath.
func stillAtPath(f *os.File) (bool, error) {
	var open, named unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &open); err != nil {
		return false, err
	}
	if err := unix.Stat(mountLockPath, &named); err != nil {
		return false, err
	}
	return open.Dev == named.Dev && open.Ino == named.Ino, nil
}

// holderStamp is a holder's stamp: when it took the turn (CLOCK_BOOTTIME)
// and its lease.
type holderStamp struct {
	pid          int
	taken, lease time.Duration
}

// readStamp reads the holder's stamp from f; ok is false when it is blank
// or does not parse (a holder that has not written it yet, or a read
// beside its write).
func readStamp(f *os.File) (h holderStamp, ok bool) {
	buf := make([]byte, stampSize)
	n, _ := f.ReadAt(buf, 0)
	return parseStamp(string(buf[:n]))
}

// parseStamp parses a stamp (see stampSize); ok is false unless it holds
// three positive numbers.
func parseStamp(s string) (h holderStamp, ok bool) {
	fields := strings.Fields(strings.TrimRight(s, "\x00"))
	if len(fields) != 3 {
		return h, false
	}
	var v [3]int64
	for i, f := range fields {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n <= 0 {
			return h, false
		}
		v[i] = n
	}
	return holderStamp{pid: int(v[0]), taken: time.Duration(v[1]), lease: time.Duration(v[2])}, true
}

// bootNow is CLOCK_BOOTTIME: one clock for every process of the machine,
// which wall-clock steps do not move.
func bootNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
