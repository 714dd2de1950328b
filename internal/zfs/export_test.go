package zfs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// SetMountsOneAtATime has every Runner run mounts and unmounts one at a
// time (on, as on zfs-fuse) or side by side, until the test ends.
func SetMountsOneAtATime(t testing.TB, on bool) {
	t.Helper()
	old := mountsOneAtATime
	mountsOneAtATime = func() bool { return on }
	t.Cleanup(func() { mountsOneAtATime = old })
}

// MountChanging is mountChanging.
var MountChanging = mountChanging

// SetMountLease sets mountLease until the test ends.
func SetMountLease(t testing.TB, d time.Duration) {
	t.Helper()
	old := mountLease
	mountLease = d
	t.Cleanup(func() { mountLease = old })
}

// SetMountLockPath sets mountLockPath until the test ends.
func SetMountLockPath(t testing.TB, path string) {
	t.Helper()
	old := mountLockPath
	mountLockPath = path
	t.Cleanup(func() { mountLockPath = old })
}

// UseGate is, for a helper process of the tests (the test binary run
// again), the gate on as on zfs-fuse, with lease and the lock on path, for
// the rest of the process.
func UseGate(lease time.Duration, path string) {
	mountsOneAtATime = func() bool { return true }
	mountLease, mountLockPath = lease, path
}

// Turn is what LockMachine got: the turn (Held, and the stamp it wrote
// then), or none because its holder is Stuck (Newly: this wait was the
// first to find it so) or the lock Unusable.
type Turn struct {
	Held         bool
	Stamp        string
	Stuck, Newly bool
	Unusable     error
}

// LockMachine is lockMachine, for the tests outside the package; a turn
// it takes is given back before it returns.
func LockMachine(ctx context.Context) (Turn, error) {
	turn, err := lockMachine(ctx)
	out := Turn{Held: turn.lock != nil, Stuck: turn.stuck, Newly: turn.newly, Unusable: turn.unusable}
	if turn.lock != nil {
		buf := make([]byte, stampSize)
		n, _ := turn.lock.f.ReadAt(buf, 0)
		out.Stamp = string(buf[:n])
		turn.lock.release()
	}
	return out, err
}

// ParseStamp is parseStamp: the holder's PID, when it took the turn and
// its lease.
func ParseStamp(s string) (pid int, taken, lease time.Duration, ok bool) {
	h, ok := parseStamp(s)
	return h.pid, h.taken, h.lease, ok
}

// Stamp is a holder's stamp as the lock file holds it, taken ago.
func Stamp(pid int, ago, lease time.Duration) []byte {
	s := fmt.Sprintf("%d %d %d", pid, bootNow()-ago, lease)
	return []byte(s + strings.Repeat(" ", stampSize-len(s)))
}

// StampSize is stampSize.
const StampSize = stampSize

// ForgetLockNotes lets the runner log again why the machine's lock cannot
// be used, and forgets the holder found stuck last, until the test ends.
func ForgetLockNotes(t testing.TB) {
	t.Helper()
	forget := func() {
		lockProblems.mu.Lock()
		lockProblems.seen = nil
		lockProblems.mu.Unlock()
		stuckHolder.ino, stuckHolder.stamp = 0, holderStamp{}
	}
	forget()
	t.Cleanup(forget)
}

// BootNow is bootNow.
var BootNow = bootNow
