package slots_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// TestConcurrency_ReserveWhileAnotherReleaseIsPaused (issue 10): the
// release of scratch-0 hangs in `zfs rename` (a wrapper first on PATH
// pauses it) while the fingerprint loop's Sync comes round. A Reserve on
// the fresh scratch-1 must not wait for either: it costs one zfs command.
// Meanwhile scratch-0 is shown unhealthy ("releasing") at once, and once
// the rename goes on the release completes.
func TestConcurrency_ReserveWhileAnotherReleaseIsPaused(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 2)
	o1, o2 := owner(1), owner(2)
	s0 := withoutSpare(t, e, w, a, "scratch-0", o1)
	guid := e.guid(t, s0.Dataset)

	a.end(o1)
	changed := e.mgr.Changed()
	released := releasePausedAtRename(t, e, w)

	// The release is under way: the slot says so, and the change was
	// published (the fingerprint loop waits on Changed).
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no change published when the release started")
	}
	got := slotByID(t, e, "scratch-0")
	must.False(t, got.Healthy)
	must.StrContains(t, got.HealthDesc, "releasing")

	// The fingerprint loop's Sync comes round while the rename hangs.
	synced := make(chan error, 1)
	go func() { synced <- e.mgr.Sync(context.Background()) }()

	a.hold("scratch-1", o2)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-1"})
	took := time.Since(start)
	must.NoError(t, err)
	must.Eq(t, "scratch-1", res[0].ID)
	t.Logf("Reserve on scratch-1 took %s while scratch-0's rename was paused", took)
	must.Less(t, 3*time.Second, took, must.Sprint("a Reserve on a fresh slot waits for nothing but its own zfs command (and the 2 s identification grace at most)"))
	must.EqOp(t, record.StateReserved, slotByID(t, e, "scratch-1").State)

	// Sync leaves the slot under release to its release and does not wait.
	select {
	case err := <-synced:
		must.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Sync waited for another slot's release")
	}
	must.EqOp(t, string(record.StateArchived), stateOf(t, e, s0.Dataset)) // its fate, recorded first
	resumeRelease(t, w, released)
	checkFresh(t, e, "scratch-0", guid)
	got = slotByID(t, e, "scratch-1")
	must.Eq(t, record.StateReserved, got.State, must.Sprint("Sync must not undo the reservation made while it ran"))
}

// TestConcurrency_LastInstanceStaysSchedulable: while the only slot of a
// class is released it is still offered (healthy, saying why), because
// Nomad would block a job evaluated meanwhile for good (a device that
// turns healthy does not re-evaluate blocked jobs). A Reserve placed on it
// waits for the fresh dataset and gets it.
func TestConcurrency_LastInstanceStaysSchedulable(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	o1, o2 := owner(1), owner(2)
	s0 := withoutSpare(t, e, w, a, "scratch-0", o1)
	guid := e.guid(t, s0.Dataset)

	a.end(o1)
	w.Pause("rename")
	released := make(chan error, 1)
	go func() { released <- e.mgr.ReleaseEnded(context.Background()) }()
	w.WaitPaused(t, "rename", 30*time.Second)
	got := slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateReleasing, got.State)
	must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
	must.StrContains(t, got.HealthDesc, "fresh soon (releasing: ")

	// The next tenant is placed on it: its Reserve waits for the release.
	a.hold("scratch-0", o2)
	reserved := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
		reserved <- err
	}()
	select {
	case err := <-reserved:
		t.Fatalf("Reserve returned while the release was paused: %v", err)
	case <-time.After(time.Second):
	}
	w.Resume("rename")
	must.NoError(t, <-released)
	select {
	case err := <-reserved:
		must.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Reserve did not get the fresh dataset")
	}
	got = slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateReserved, got.State)
	must.NotEq(t, guid, e.guid(t, got.Dataset))
	entries, err := os.ReadDir(got.Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
}

// TestConcurrency_ReserveWaitEndsWithItsContext: a Sync mounts a free slot
// that was unmounted by hand, and its `zfs mount` hangs. A Reserve of that
// slot waits for the slot's lock only until its own context ends (Nomad's
// reserve_timeout), not for the zfs command's timeout.
func TestConcurrency_ReserveWaitEndsWithItsContext(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	s0 := slotByID(t, e, "scratch-0")
	e.pool.ZFS(t, "unmount", s0.Dataset)
	w.Pause("mount")
	synced := make(chan error, 1)
	go func() { synced <- e.mgr.Sync(context.Background()) }()
	w.WaitPaused(t, "mount", 30*time.Second)

	a.hold("scratch-0", owner(1))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	took := time.Since(start)
	must.ErrorContains(t, err, "scratch-0")
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.Less(t, 5*time.Second, took, must.Sprintf("Reserve took %s", took))
	t.Logf("Reserve gave up after %s: %v", took.Round(10*time.Millisecond), err)

	w.Resume("mount")
	must.NoError(t, <-synced)
	got := slotByID(t, e, "scratch-0")
	must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
	must.Eq(t, record.StateFree, got.State)
}

// TestConcurrency_ReleasesRunSideBySide (issue 10): the release of
// scratch-0 hangs in its `zfs rename` while the allocation holding
// scratch-1 ends. The release loop acts on that end at once: scratch-1 is
// released and fresh again while scratch-0's rename is still paused, and
// scratch-0 completes once it goes on.
func TestConcurrency_ReleasesRunSideBySide(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 2)
	o1, o2 := owner(1), owner(2)
	s0 := withoutSpare(t, e, w, a, "scratch-0", o1)
	s1 := withoutSpare(t, e, w, a, "scratch-1", o2)
	guid0, guid1 := e.guid(t, s0.Dataset), e.guid(t, s1.Dataset)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go e.mgr.Run(ctx, time.Hour) // woken by Kick only

	w.PauseFor("rename", s0.Dataset)
	a.end(o1)
	e.mgr.Kick()
	w.WaitPaused(t, "rename", 30*time.Second)

	start := time.Now()
	a.end(o2)
	e.mgr.Kick()
	fresh := func(id, old string) bool {
		s := slotByID(t, e, id)
		return s.State == record.StateFree && s.Healthy && e.guid(t, s.Dataset) != old
	}
	deadline := time.Now().Add(30 * time.Second)
	for !fresh("scratch-1", guid1) {
		if time.Now().After(deadline) {
			t.Fatalf("scratch-1 was not released while scratch-0's rename was paused: %+v", slotByID(t, e, "scratch-1"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("scratch-1 fresh %s after its allocation ended, scratch-0's rename still paused", time.Since(start).Round(time.Millisecond))
	must.Eq(t, record.StateReleasing, slotByID(t, e, "scratch-0").State)
	must.Eq(t, guid0, e.guid(t, s0.Dataset))

	w.Resume("rename")
	deadline = time.Now().Add(time.Minute)
	for !fresh("scratch-0", guid0) {
		if time.Now().After(deadline) {
			t.Fatalf("scratch-0 did not complete its release: %+v", slotByID(t, e, "scratch-0"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	must.SliceLen(t, 2, archived(t, e))
}

// TestConcurrency_ReserveGivingUpLeavesOthersAlone: the next tenant's
// Reserve drives the release of scratch-0, whose `zfs rename` hangs, and
// gives up at its deadline. Its deadline is not the release's: the other
// slot stays healthy and reservable meanwhile, and the release completes
// once the rename goes on.
func TestConcurrency_ReserveGivingUpLeavesOthersAlone(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 2)
	o1, o2, o3 := owner(1), owner(2), owner(3)
	s0 := withoutSpare(t, e, w, a, "scratch-0", o1)
	guid := e.guid(t, s0.Dataset)
	a.end(o1)
	a.hold("scratch-0", o2)

	w.PauseFor("rename", s0.Dataset)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.ErrorContains(t, err, "reserve_timeout")
	w.WaitPaused(t, "rename", 30*time.Second)

	got := slotByID(t, e, "scratch-1")
	must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
	a.hold("scratch-1", o3)
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	_, err = e.mgr.Reserve(rctx, []string{"scratch-1"})
	must.NoError(t, err)

	w.Resume("rename")
	deadline := time.Now().Add(time.Minute)
	for slotByID(t, e, "scratch-0").State == record.StateReleasing {
		if time.Now().After(deadline) {
			t.Fatalf("the release did not complete: %+v", slotByID(t, e, "scratch-0"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, guid, e.guid(t, names[0]))
}

// TestConcurrency_SyncReadsTheTreeOnceWhileASlotIsReleased (issue 46): the
// fingerprint loop's Sync comes round while a release holds its slot (its
// `zfs rename` paused by a wrapper first on PATH). The slot's steps are
// the release's, which Sync leaves to it; Sync then reads the tree once,
// not a second time to check changes it did not make. Under a churn of
// short jobs some slot is nearly always being released, and each read of
// the tree lists every archive.
func TestConcurrency_SyncReadsTheTreeOnceWhileASlotIsReleased(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 2)
	o1 := owner(1)
	s0 := withoutSpare(t, e, w, a, "scratch-0", o1)

	a.end(o1)
	released := releasePausedAtRename(t, e, w)
	must.EqOp(t, string(record.StateArchived), stateOf(t, e, s0.Dataset)) // its fate: the steps left are the release's

	treeReads := func() int {
		n := 0
		for _, c := range w.Calls() {
			if c.Cmd == "zfs" && len(c.Args) > 0 && c.Args[0] == "get" && slices.Contains(c.Args, "-r") && c.Args[len(c.Args)-1] == e.cfg.Parent {
				n++
			}
		}
		return n
	}
	before := treeReads()
	must.NoError(t, e.mgr.Sync(context.Background()))
	must.Eq(t, 1, treeReads()-before, must.Sprint("one read of the tree: the only changes due were the paused release's"))
	must.False(t, slotByID(t, e, "scratch-0").Healthy, must.Sprint("the slot under release is left as the release shows it"))

	resumeRelease(t, w, released)
}

// releasePausedAtRename pauses `zfs rename` (w first on PATH) and starts
// ReleaseEnded, whose outcome it returns on the channel; on return the
// release waits in its rename.
func releasePausedAtRename(t *testing.T, e *env, w *zfstest.Wrapper) <-chan error {
	t.Helper()
	w.Pause("rename")
	released := make(chan error, 1)
	go func() { released <- e.mgr.ReleaseEnded(context.Background()) }()
	w.WaitPaused(t, "rename", 30*time.Second)
	return released
}

// resumeRelease lets the paused rename go on and fails t unless the
// release (released, from releasePausedAtRename) ends well within a minute.
func resumeRelease(t *testing.T, w *zfstest.Wrapper, released <-chan error) {
	t.Helper()
	w.Resume("rename")
	select {
	case err := <-released:
		must.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the release did not finish after the rename went on")
	}
}
