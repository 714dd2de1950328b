package slots_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// withSpare reserves device id for o and writes into it (reserveAndWrite),
// then waits for the slot's spare, made in the background, and returns
// the slot as reserved and the spare's name.
func withSpare(t *testing.T, e *env, a *allocs, id string, o record.Owner) (slots.Slot, string) {
	t.Helper()
	s := reserveAndWrite(t, e, a, id, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, e.mgr.Wait(ctx))
	spare := slotByID(t, e, id).Spare
	must.NotEq(t, "", spare, must.Sprint("a slot in use has a spare"))
	must.NotEq(t, s.Dataset, spare)
	must.Eq(t, "free", stateOf(t, e, spare))
	return s, spare
}

// spareCase is a slot whose tenant o1 wrote into it and has ended, with a
// spare made, and the `zfs rename` of o1's dataset paused by a wrapper
// first on PATH.
type spareCase struct {
	w      *zfstest.Wrapper
	e      *env
	a      *allocs
	o1, o2 record.Owner
	s0     slots.Slot // as o1 had it
	spare  string
	guid   string // of o1's dataset
}

func newSpareCase(t *testing.T) *spareCase {
	t.Helper()
	c := &spareCase{w: zfstest.NewWrapper(t), o1: owner(1), o2: owner(2)}
	c.w.SetPATH(t)
	c.e, c.a = newReleaseEnv(t, 1)
	c.s0, c.spare = withSpare(t, c.e, c.a, "scratch-0", c.o1)
	c.guid = c.e.guid(t, c.s0.Dataset)
	c.a.end(c.o1)
	c.w.PauseFor("rename", c.s0.Dataset)
	return c
}

// newLegacySpareCase is newSpareCase with the spare recorded free as an
// earlier version made it (not armed: package armed), so that its handover
// marks it reserved with a zfs set beside the fate: the tests of that mark
// use it.
func newLegacySpareCase(t *testing.T) *spareCase {
	t.Helper()
	c := newSpareCase(t)
	c.e.pool.ZFS(t, "set", record.PropState+"="+string(record.StateFree), c.spare)
	c.e.sync(t)
	return c
}

// refuseFate makes ZFS refuse the old dataset's fate, as a full pool does
// (a wrapper first on PATH), with the rename let go and o2 placed on the
// slot: o2's handover of a `free` spare (newLegacySpareCase) then fails
// at its first mark; an armed spare's is made all the same, the fate
// refused behind it (reserveBehindARefusedFate).
func (c *spareCase) refuseFate() {
	c.w.Resume("rename")
	c.a.hold("scratch-0", c.o2)
	c.w.FailFor("set", c.s0.Dataset, "cannot set property for '"+c.s0.Dataset+"': out of space")
}

// TestSpare_HandOverWhileTheReleaseIsPaused (issue 10): the next tenant of
// a slot whose owner has ended gets the slot's spare with no zfs command
// (the spare, armed, is handed over in memory: package armed) and waits for
// nothing else: the owner's dataset's fate is written behind it, and the
// dataset archived, here with both its `zfs set` and its `zfs rename`
// paused by a wrapper first on PATH. Once they go on, the archive holds
// the owner's data and the slot has a new spare.
func TestSpare_HandOverWhileTheReleaseIsPaused(t *testing.T) {
	c := newSpareCase(t)
	w, e, a, o1, o2, s0, spare, guid := c.w, c.e, c.a, c.o1, c.o2, c.s0, c.spare, c.guid
	a.hold("scratch-0", o2)
	w.PauseFor("set", s0.Dataset)
	creates := w.Count("create")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	took := time.Since(start)
	must.NoError(t, err)
	t.Logf("Reserve took %s with the owner's release paused", took.Round(time.Millisecond))
	must.Less(t, 3*time.Second, took, must.Sprint("the handover waits for no zfs command"))
	must.Eq(t, spare, res[0].Dataset)
	must.Eq(t, creates, w.Count("create"))
	must.Eq(t, record.StateReserved, slotByID(t, e, "scratch-0").State)
	entries, err := os.ReadDir(res[0].Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
	checkReadied(t, e, res[0].Mountpoint)

	// Behind it, the owner's dataset's fate (paused: the Reserve did not
	// wait for it), then its way to the archive.
	fate := w.WaitPaused(t, "set", 30*time.Second)
	must.Eq(t, []string{"set", record.PropState + "=archived", s0.Dataset}, fate, must.Sprint("the owner's dataset's fate, its owner recorded already"))
	must.Eq(t, "reserved", stateOf(t, e, s0.Dataset), must.Sprint("kept as the owner's until the fate lands"))
	must.NoError(t, e.mgr.Sync(ctx)) // a read meanwhile leaves the slot to its release
	got := slotByID(t, e, "scratch-0")
	must.Eq(t, spare, got.Dataset)
	must.Eq(t, record.StateReserved, got.State)
	must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
	w.Resume("set")
	w.WaitPaused(t, "rename", 30*time.Second)
	must.Eq(t, "archived", stateOf(t, e, s0.Dataset))
	must.Eq(t, guid, e.guid(t, s0.Dataset))

	w.Resume("rename")
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	must.NoError(t, e.mgr.Wait(wctx))
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, guid, e.guid(t, names[0]))
	must.Eq(t, "tenant "+o1.AllocID, readArchived(t, e, names[0], "data.txt"))

	got = slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateReserved, got.State)
	must.Eq(t, spare, got.Dataset)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, o2.AllocID, recordedOwner(t, e, spare).AllocID)
	// Once the owner is recorded, the released name is made again as the
	// next spare (package armed: none beside a handover not recorded yet).
	must.NoError(t, e.mgr.Wait(wctx))
	got = slotByID(t, e, "scratch-0")
	must.Eq(t, s0.Dataset, got.Spare, must.Sprint("the released name is made again as the next spare"))
	must.NotEq(t, guid, e.guid(t, got.Spare))
}

// kickedPass runs the release loop until the test ends, kicks it, and
// returns once the pass that the kick started holds the slot id (and those
// named by more) for its next tenant (what it holds, it holds from then on;
// a test whose steps before the Reserve take real zfs commands sets a
// longer hold first: SetSpareHold). It returns when it kicked.
func kickedPass(t *testing.T, e *env, id string, more ...string) (kicked time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); e.mgr.Run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); <-ran })
	kicked = time.Now()
	e.mgr.Kick()
	ids := append([]string{id}, more...)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		for _, id := range ids {
			if !e.mgr.HeldForNext(id) {
				return false
			}
		}
		return true
	}), wait.Timeout(10*time.Second), wait.Gap(5*time.Millisecond)), must.Sprintf("the kicked pass holds %v for their next tenant", ids))
	return kicked
}

// TestSpare_KickedPassLeavesTheSpareToTheNextTenant (issue 10): a release
// pass started by a kick (a new allocation list) leaves a slot whose owner
// has ended and whose spare is ready to the next tenant's Reserve for a
// while, and that Reserve hands the spare over as it would a fresh slot
// (the old dataset's fate behind it), the asker identified by the read
// made beside it. When no Reserve comes, the slot is released once
// the hold is over.
func TestSpare_KickedPassLeavesTheSpareToTheNextTenant(t *testing.T) {
	for _, next := range []bool{true, false} {
		t.Run(map[bool]string{true: "the next tenant comes", false: "no tenant comes"}[next], func(t *testing.T) {
			c := newSpareCase(t)
			w, e, a, o2, s0, spare, guid := c.w, c.e, c.a, c.o2, c.s0, c.spare, c.guid
			w.Resume("rename")
			// Longer than the default: the zfs reads before the Reserve
			// may outlast it on a busy machine.
			hold := map[bool]time.Duration{true: time.Minute, false: 3 * time.Second}[next]
			e.mgr.SetSpareHold(hold)
			kicked := kickedPass(t, e, "scratch-0")
			must.Eq(t, "reserved", stateOf(t, e, s0.Dataset), must.Sprint("held for the next tenant"))
			if next {
				a.hold("scratch-0", o2)
				before := len(w.Calls())
				rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer rcancel()
				res, err := e.mgr.Reserve(rctx, []string{"scratch-0"})
				must.NoError(t, err)
				must.Eq(t, spare, res[0].Dataset)
				must.Eq(t, o2.AllocID, res[0].Owner.AllocID, must.Sprint("identified by the read made beside the handover"))
				must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
					for _, c := range w.Calls()[before:] {
						if slices.Equal(c.Args, []string{"set", record.PropState + "=archived", s0.Dataset}) {
							return true
						}
					}
					return false
				}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)), must.Sprint("the Reserve's handover wrote the owner's dataset's fate (behind it), not the pass"))
			} else {
				// Released by the pass at the end of the hold, not before.
				must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
					st, err := e.pool.TryProp(s0.Dataset, record.PropState)
					owner, _ := e.pool.TryProp(s0.Dataset, record.PropOwner)
					return err != nil || record.StateOf(st, owner) != record.StateReserved
				}), wait.Timeout(20*time.Second), wait.Gap(20*time.Millisecond)))
				must.GreaterEq(t, hold-100*time.Millisecond, time.Since(kicked), must.Sprint("released before the hold was over"))
			}
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
				return len(archived(t, e)) == 1
			}), wait.Timeout(20*time.Second), wait.Gap(50*time.Millisecond)), must.Sprint("the ended owner's dataset archived"))
			wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
			defer wcancel()
			must.NoError(t, e.mgr.Wait(wctx))
			must.Eq(t, guid, e.guid(t, archived(t, e)[0]))
			got := slotByID(t, e, "scratch-0")
			must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
			must.Eq(t, spare, got.Dataset)
			if next {
				must.Eq(t, record.StateReserved, got.State)
				must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
				must.Eq(t, o2.AllocID, recordedOwner(t, e, spare).AllocID)
			} else {
				must.Eq(t, record.StateFree, got.State)
			}
		})
	}
}

// TestSpare_HeldPairHandedOverInPart (issue 10): a Reserve of two held
// slots (their spares `free` from an earlier build, whose handover writes
// the old dataset's fate before it) whose second spare cannot be handed
// over (a wrapper refuses that fate) fails,
// but the first slot, already handed to the asker, is identified all the
// same: the next Reserve gives it back to its owner, the asker, instead of
// keeping it for want of one.
func TestSpare_HeldPairHandedOverInPart(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 2)
	o1, o2 := owner(1), owner(2)
	_, spare0 := withSpare(t, e, a, "scratch-0", o1)
	s1, spare1 := withSpare(t, e, a, "scratch-1", o1)
	for _, sp := range []string{spare0, spare1} {
		e.pool.ZFS(t, "set", record.PropState+"="+string(record.StateFree), sp)
	}
	e.sync(t)
	a.end(o1)
	e.mgr.SetSpareHold(time.Minute) // the Reserve must find both held
	kickedPass(t, e, "scratch-0", "scratch-1")

	a.hold("scratch-0", o2)
	a.hold("scratch-1", o2)
	// The second handover's old dataset's fate is refused (the spare's
	// mark beside it is undone).
	w.FailFor("set", s1.Dataset, "cannot set property for '"+s1.Dataset+"': out of space")
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err := e.mgr.Reserve(rctx, []string{"scratch-0", "scratch-1"})
	rcancel()
	must.ErrorContains(t, err, "out of space")
	got := slotByID(t, e, "scratch-0")
	must.Eq(t, spare0, got.Dataset)
	must.Eq(t, o2.AllocID, got.Owner.AllocID, must.Sprint("handed over, and identified"))

	w.Unfail("set")
	rctx, rcancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	res, err := e.mgr.Reserve(rctx, []string{"scratch-0", "scratch-1"})
	must.NoError(t, err)
	must.Eq(t, spare0, res[0].Dataset)
	must.Eq(t, spare1, res[1].Dataset)
	must.NoError(t, e.mgr.Wait(rctx))
	must.SliceLen(t, 2, archived(t, e))
}

// TestSpare_ReleasedSlotServesAtOnce (issue 10): when the release loop
// finds the owner ended before the next tenant is placed, the slot's
// spare is offered at once, healthy, while the owner's dataset is
// archived behind it (its `zfs rename` paused). A Reserve on it and a Sync
// meanwhile wait for neither.
func TestSpare_ReleasedSlotServesAtOnce(t *testing.T) {
	c := newSpareCase(t)
	w, e, a, o2, s0, spare, guid := c.w, c.e, c.a, c.o2, c.s0, c.spare, c.guid
	released := make(chan error, 1)
	go func() { released <- e.mgr.ReleaseEnded(context.Background()) }()
	w.WaitPaused(t, "rename", 30*time.Second)
	got := slotByID(t, e, "scratch-0")
	must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
	must.Eq(t, record.StateFree, got.State)
	must.Eq(t, spare, got.Dataset)

	a.hold("scratch-0", o2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	t.Logf("Reserve took %s with the release of the slot's old dataset paused", time.Since(start).Round(time.Millisecond))
	must.Less(t, 3*time.Second, time.Since(start))
	must.Eq(t, spare, res[0].Dataset)
	synced := make(chan error, 1)
	go func() { synced <- e.mgr.Sync(context.Background()) }()
	select {
	case err := <-synced:
		must.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Sync waited for the release")
	}

	w.Resume("rename")
	must.NoError(t, <-released)
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	must.NoError(t, e.mgr.Wait(wctx))
	got = slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateReserved, got.State)
	must.Eq(t, spare, got.Dataset)
	must.Eq(t, s0.Dataset, got.Spare)
	must.NotEq(t, guid, e.guid(t, got.Spare))
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, guid, e.guid(t, names[0]))
}

// TestSpare_ReleaseWithTheOwnerStillPending: while the spare of a fresh
// reservation is made (its `zfs create` paused), the slot's lock is taken
// and the owner cannot be recorded; it stays pending. When that owner
// ends, one release pass releases the slot all the same, recording the
// owner on the archive, whichever of the release and the recording of the
// owner takes the slot's lock first. (A dataset of an earlier version: an
// armed one gets its spare only once its owner is recorded, package armed.)
func TestSpare_ReleaseWithTheOwnerStillPending(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	e.pool.ZFS(t, "set", record.PropState+"="+string(record.StateFree), slotByID(t, e, "scratch-0").Dataset)
	e.sync(t)
	o := owner(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w.Pause("create")
	a.hold("scratch-0", o)
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	w.WaitPaused(t, "create", 30*time.Second)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.Eq(t, "", e.pool.Prop(t, res[0].Dataset, record.PropOwner), must.Sprint("pending while the spare is made"))
	w.Resume("create")
	must.NoError(t, e.mgr.Wait(ctx))
	spare := slotByID(t, e, "scratch-0").Spare
	must.NotEq(t, "", spare)

	a.start(o)
	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	got := slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateFree, got.State, must.Sprint(got.HealthDesc))
	must.Eq(t, spare, got.Dataset)
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, o.AllocID, recordedOwner(t, e, names[0]).AllocID)
}
