package zfs

import (
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

// LockMachine is lockMachine.
var LockMachine = lockMachine
