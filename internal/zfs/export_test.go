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
