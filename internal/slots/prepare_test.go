package slots_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// prepareCase is an env of n slots behind a wrapper first on PATH, its
// manager learning about allocations from a.
type prepareCase struct {
	w *zfstest.Wrapper
	e *env
	a *allocs
	// since is how many calls the wrapper had seen when the test's own
	// set-up ended (legacy).
	since int
}

// calls returns the zfs calls made since the test's set-up.
func (c *prepareCase) calls() []zfstest.Call { return c.w.Calls()[c.since:] }

func newPrepareCase(t *testing.T, n int) *prepareCase {
	t.Helper()
	c := &prepareCase{w: zfstest.NewWrapper(t)}
	c.w.SetPATH(t)
	c.e, c.a = newReleaseEnv(t, n)
	return c
}

// legacy records every slot's dataset free as an earlier version made it
// (not armed: package armed), and syncs: such a dataset is prepared and
// reserved with one zfs set, which these tests pause or fail.
func (c *prepareCase) legacy(t *testing.T) {
	t.Helper()
	for _, s := range c.e.mgr.Slots() {
		c.e.pool.ZFS(t, "set", record.PropState+"="+string(record.StateFree), s.Dataset)
	}
	c.e.sync(t)
	c.since = len(c.w.Calls())
}

// prepare runs the manager's preparation step and waits for it.
func (c *prepareCase) prepare(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, c.e.mgr.Prepare(ctx))
}

// prepareHeld starts the preparation step with the `zfs set` on ds paused
// (w.Resume("set") lets it go), and returns once that command waits; the
// step's error comes on the channel.
func (c *prepareCase) prepareHeld(t *testing.T, ds string) <-chan error {
	t.Helper()
	c.w.PauseFor("set", ds)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	prepared := make(chan error, 1)
	go func() { prepared <- c.e.mgr.Prepare(ctx) }()
	c.w.WaitPaused(t, "set", 30*time.Second)
	return prepared
}

// reserved is what one Reserve gave, the zfs calls made while it ran, and
// how many full and small reads it made.
type reserved struct {
	res          []slots.Slot
	calls        []zfstest.Call
	views, holds int32
}

// reserve calls Reserve with a deadline, and waits for the proof made
// behind it when it answered before its proof (proof.go): the reads it
// counts include that proof's.
func (c *prepareCase) reserve(t *testing.T, timeout time.Duration, ids ...string) (reserved, error) {
	t.Helper()
	before, v0, h0 := len(c.w.Calls()), c.a.views.Load(), c.a.holdsCalls.Load()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := c.e.mgr.Reserve(ctx, ids)
	must.NoError(t, c.e.mgr.WaitProofs(ctx))
	return reserved{res: res, calls: c.w.Calls()[before:], views: c.a.views.Load() - v0, holds: c.a.holdsCalls.Load() - h0}, err
}

// sets returns the `zfs set` calls among calls, as "prop=value dataset",
// but for those of the owner: a preparation records it behind its mark,
// in the background, as after any Reserve.
func sets(calls []zfstest.Call) []string {
	var out []string
	for _, c := range calls {
		if c.Cmd == "zfs" && len(c.Args) >= 3 && c.Args[0] == "set" && !strings.HasPrefix(c.Args[1], record.PropOwner+"=") {
			out = append(out, strings.Join(c.Args[1:], " "))
		}
	}
	return out
}

// setsOn returns the `zfs set` calls among calls on dataset ds.
func setsOn(calls []zfstest.Call, ds string) []string {
	var out []string
	for _, s := range sets(calls) {
		if strings.HasSuffix(s, " "+ds) {
			out = append(out, s)
		}
	}
	return out
}

// TestPrepare_FreshSlotHandedOverWithoutZFS (issue 10): an allocation
// placed on a free slot has the slot reserved for it before it asks; its
// Reserve then runs no zfs command and reads no node list: one small read
// of the allocation proves the asker. Two devices of one task take one
// read. The owner is recorded behind, as after any Reserve.
func TestPrepare_FreshSlotHandedOverWithoutZFS(t *testing.T) {
	c := newPrepareCase(t, 3)
	e, a := c.e, c.a
	B := owner(1)
	a.hold("scratch-0", B)
	a.hold("scratch-2", B)
	free := slotByID(t, e, "scratch-1").Dataset

	c.prepare(t)
	for _, id := range []string{"scratch-0", "scratch-2"} {
		s := slotByID(t, e, id)
		must.Eq(t, record.StateReserved, s.State)
		// Prepared in memory: the dataset is armed (slots/armed), and
		// its owner is recorded behind.
		must.StrHasPrefix(t, "armed:", e.pool.Prop(t, s.Dataset, record.PropState))
		must.Eq(t, B.AllocID, s.Owner.AllocID)
		must.True(t, s.Healthy, must.Sprint(s.HealthDesc))
	}
	must.Eq(t, "free", stateOf(t, e, free), must.Sprint("no allocation was placed on it"))

	r, err := c.reserve(t, 10*time.Second, "scratch-0", "scratch-2")
	must.NoError(t, err)
	must.SliceLen(t, 2, r.res)
	for _, s := range r.res {
		must.SliceEmpty(t, setsOn(r.calls, s.Dataset), must.Sprint("the Reserve of a prepared slot writes nothing"))
	}
	must.EqOp(t, int32(0), r.views, must.Sprint("no read of the node's list"))
	must.EqOp(t, int32(1), r.holds, must.Sprint("one small read of the allocation"))
	for _, s := range r.res {
		must.Eq(t, B.AllocID, s.Owner.AllocID)
		entries, err := os.ReadDir(s.Mountpoint)
		must.NoError(t, err)
		must.SliceEmpty(t, entries)
		checkReadied(t, e, s.Mountpoint)
	}
	must.NoError(t, e.mgr.Wait(context.Background()))
	must.NoError(t, e.mgr.ReleaseEnded(context.Background())) // records the owner
	for _, s := range r.res {
		must.Eq(t, B.AllocID, recordedOwner(t, e, s.Dataset).AllocID)
	}

	// A repeated Reserve (the task restarted) takes the usual path: the
	// dataset may now hold the tenant's data.
	a.start(B)
	must.NoError(t, os.WriteFile(filepath.Join(r.res[0].Mountpoint, "data.txt"), []byte("tenant B"), 0o644))
	again, err := c.reserve(t, 10*time.Second, "scratch-0")
	must.NoError(t, err)
	must.Eq(t, r.res[0].Dataset, again.res[0].Dataset)
	must.Positive(t, again.views, must.Sprint("a used dataset goes to its owner on a read of the node's list"))
}

// TestPrepare_SpareOfAnEndedTenant: the next allocation placed on a slot
// whose tenant has ended gets the slot's spare, prepared for it (armed: in
// memory, the tenant's dataset's fate written behind it), and its Reserve
// writes nothing. The tenant's data reaches the archive behind it.
func TestPrepare_SpareOfAnEndedTenant(t *testing.T) {
	c := newPrepareCase(t, 1)
	e, a := c.e, c.a
	o1, o2 := owner(1), owner(2)
	s0, spare := withSpare(t, e, a, "scratch-0", o1)
	guid := e.guid(t, s0.Dataset)
	a.end(o1)
	a.hold("scratch-0", o2)

	c.prepare(t)
	got := slotByID(t, e, "scratch-0")
	must.Eq(t, spare, got.Dataset)
	// Reserved for o2 in memory (the spare is armed), recorded behind it.
	must.Eq(t, record.StateReserved, got.State)
	must.Eq(t, o2.AllocID, got.Owner.AllocID)

	r, err := c.reserve(t, 10*time.Second, "scratch-0")
	must.NoError(t, err)
	must.Eq(t, spare, r.res[0].Dataset)
	// The ended tenant's dataset is archived behind (canmount, rename).
	must.SliceEmpty(t, setsOn(r.calls, spare))
	must.EqOp(t, int32(0), r.views)
	must.EqOp(t, int32(1), r.holds)
	entries, err := os.ReadDir(r.res[0].Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries, must.Sprint("the spare is empty"))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, e.mgr.Wait(ctx))
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, guid, e.guid(t, names[0]))
	must.Eq(t, "tenant "+o1.AllocID, readArchived(t, e, names[0], "data.txt"))
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.Eq(t, o2.AllocID, recordedOwner(t, e, spare).AllocID)
}

// TestPrepare_NothingFromAnIncompleteView: while the token may not see
// every namespace, the sole visible holder is no proof of the sole holder,
// and no slot is prepared.
func TestPrepare_NothingFromAnIncompleteView(t *testing.T) {
	c := newPrepareCase(t, 1)
	c.a.setIncomplete("namespace other is not readable")
	c.a.hold("scratch-0", owner(1))
	c.prepare(t)
	s := slotByID(t, c.e, "scratch-0")
	must.Eq(t, record.StateFree, s.State)
	must.Eq(t, "free", stateOf(t, c.e, s.Dataset))
}

// Fail closed: a Reserve of a slot prepared on a dataset that is not armed
// (an earlier version's here; an encrypted one alike), that the small
// read does not prove to come from the prepared allocation, hands nothing
// over at once; the usual proof, a read of the node's list made after it
// arrived, decides, and keeps the slot while it cannot. (An armed one is
// answered before its proof: proof_test.go.)
func TestPrepare_UnprovenAskerTakesTheUsualPath(t *testing.T) {
	t.Run("the prepared allocation stops, another is placed", func(t *testing.T) {
		c := newPrepareCase(t, 1)
		c.legacy(t)
		e, a := c.e, c.a
		B, C := owner(1), owner(2)
		a.hold("scratch-0", B)
		c.prepare(t)
		prepared := slotByID(t, e, "scratch-0").Dataset
		guid := e.guid(t, prepared)

		a.setStopping(B) // the scheduler frees the device at once
		a.hold("scratch-0", C)
		r, err := c.reserve(t, 2*time.Second, "scratch-0") // C asks
		must.ErrorContains(t, err, "in use by "+B.String())
		must.SliceEmpty(t, sets(r.calls))
		must.Positive(t, r.views)
		must.Eq(t, B.AllocID, slotByID(t, e, "scratch-0").Owner.AllocID, must.Sprint("still B's"))

		// B ends: C's Reserve releases B's (empty) dataset and gets a fresh one.
		a.end(B)
		r, err = c.reserve(t, 30*time.Second, "scratch-0")
		must.NoError(t, err)
		must.NotEq(t, guid, e.guid(t, r.res[0].Dataset))
	})
	t.Run("the API fails, then answers", func(t *testing.T) {
		c := newPrepareCase(t, 1)
		c.legacy(t)
		e, a := c.e, c.a
		B := owner(1)
		a.hold("scratch-0", B)
		c.prepare(t)
		prepared := slotByID(t, e, "scratch-0").Dataset

		a.setErr(errors.New("connection refused"))
		r, err := c.reserve(t, 2*time.Second, "scratch-0")
		must.ErrorContains(t, err, "cannot be read to verify the asker")
		must.EqOp(t, int32(1), r.holds)

		a.setErr(nil)
		r, err = c.reserve(t, 10*time.Second, "scratch-0")
		must.NoError(t, err)
		must.Eq(t, prepared, r.res[0].Dataset, must.Sprint("its recorded owner gets it, on the usual proof"))
	})
}

// TestPrepare_VoidWhenTheAllocationEndsUnasked: an allocation that ends
// before its task asks leaves its prepared slot recorded in use by it;
// the release pass releases it as any other, and the slot is fresh again.
func TestPrepare_VoidWhenTheAllocationEndsUnasked(t *testing.T) {
	c := newPrepareCase(t, 1)
	e, a := c.e, c.a
	B := owner(1)
	a.hold("scratch-0", B)
	c.prepare(t)
	prepared := slotByID(t, e, "scratch-0").Dataset
	guid := e.guid(t, prepared)
	a.end(B)
	c.prepare(t) // forgets the preparation
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	checkFresh(t, e, "scratch-0", guid)
}

// TestPrepare_VoidWhenAnIncompleteViewShowsTheEnd: a view that cannot
// show every namespace proves no sole holder, but the end of the prepared
// allocation, which it lists, is proof enough to forget the preparation.
// The next asker's Reserve then takes the usual path at once, and spends
// no read on the ended allocation (a read that, against a hung API, costs
// it up to 2 s); the ended allocation's slot is kept while the view
// cannot prove who may have it. A prepared allocation that such a view
// lists live, still the sole visible holder, keeps its preparation: its
// Reserve is proved by the one small read, and runs no zfs command.
func TestPrepare_VoidWhenAnIncompleteViewShowsTheEnd(t *testing.T) {
	B, C := owner(1), owner(2)
	for _, tc := range []struct {
		name  string
		then  func(a *allocs) // after the view becomes incomplete
		asker record.Owner
		void  bool
	}{
		{"the prepared allocation ended, another asks", func(a *allocs) { a.end(B); a.hold("scratch-0", C) }, C, true},
		{"the prepared allocation asks", func(*allocs) {}, B, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newPrepareCase(t, 1)
			e, a := c.e, c.a
			a.hold("scratch-0", B)
			c.prepare(t)
			prepared := slotByID(t, e, "scratch-0").Dataset
			must.Eq(t, record.StateReserved, slotByID(t, e, "scratch-0").State)

			a.setIncomplete("namespace other is not readable")
			tc.then(a)
			c.prepare(t)
			r, err := c.reserve(t, 2*time.Second, "scratch-0")
			must.SliceEmpty(t, sets(r.calls))
			if tc.void {
				must.Error(t, err)
				must.EqOp(t, int32(0), r.holds, must.Sprint("no read of the ended allocation the preparation was for"))
				s := slotByID(t, e, "scratch-0")
				must.Eq(t, prepared, s.Dataset)
				must.Eq(t, B.AllocID, s.Owner.AllocID, must.Sprint("still B's while the view cannot prove more"))
				must.Eq(t, record.StateReserved, s.State)
				return
			}
			must.NoError(t, err)
			must.EqOp(t, int32(1), r.holds, must.Sprint("the preparation kept: one small read proves the asker"))
			must.EqOp(t, int32(0), r.views)
			must.Eq(t, prepared, r.res[0].Dataset)
		})
	}
}

// A Reserve that arrives while the preparation's zfs command runs waits
// for it, and then writes nothing itself; a preparation does not start
// for a slot whose Reserve is under way. (A dataset of an earlier version:
// an armed one is prepared with no zfs command.)
func TestPrepare_ReserveMeetsThePreparation(t *testing.T) {
	t.Run("preparation first", func(t *testing.T) {
		c := newPrepareCase(t, 1)
		c.legacy(t)
		e, a, w := c.e, c.a, c.w
		B := owner(1)
		a.hold("scratch-0", B)
		ds := slotByID(t, e, "scratch-0").Dataset
		prepared := c.prepareHeld(t, ds)
		time.AfterFunc(300*time.Millisecond, func() { w.Resume("set") })
		r, err := c.reserve(t, 20*time.Second, "scratch-0")
		must.NoError(t, err)
		must.NoError(t, <-prepared)
		must.Eq(t, ds, r.res[0].Dataset)
		must.Eq(t, B.AllocID, r.res[0].Owner.AllocID)
		for _, s := range sets(r.calls) {
			must.StrContains(t, s, ds, must.Sprint("only the preparation's own marks"))
		}
		must.SliceLen(t, 1, setsOn(c.calls(), ds), must.Sprint("the state, once"))
		must.EqOp(t, int32(0), r.views)
		must.EqOp(t, int32(1), r.holds)
	})
	t.Run("part of the devices prepared", func(t *testing.T) {
		c := newPrepareCase(t, 2)
		c.legacy(t)
		e, a, w := c.e, c.a, c.w
		B := owner(1)
		a.hold("scratch-0", B)
		ds0 := slotByID(t, e, "scratch-0").Dataset
		prepared := c.prepareHeld(t, ds0)
		a.hold("scratch-1", B) // placed after the preparation's read
		time.AfterFunc(300*time.Millisecond, func() { w.Resume("set") })
		r, err := c.reserve(t, 20*time.Second, "scratch-0", "scratch-1")
		must.NoError(t, err)
		must.NoError(t, <-prepared)
		must.SliceLen(t, 2, r.res)
		for _, s := range r.res {
			must.Eq(t, B.AllocID, s.Owner.AllocID, must.Sprint(s.ID))
		}
		must.Eq(t, ds0, r.res[0].Dataset)
		must.Positive(t, r.views, must.Sprint("the usual proof: a read of the node's list"))
	})
	t.Run("Reserve first", func(t *testing.T) {
		c := newPrepareCase(t, 1)
		c.legacy(t)
		e, a, w := c.e, c.a, c.w
		B := owner(1)
		a.hold("scratch-0", B)
		ds := slotByID(t, e, "scratch-0").Dataset
		w.PauseFor("set", ds)
		type result struct {
			res []slots.Slot
			err error
		}
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
			done <- result{res, err}
		}()
		w.WaitPaused(t, "set", 30*time.Second) // the Reserve's own mark
		c.prepare(t)                           // starts nothing: a Reserve is under way
		w.Resume("set")
		r := <-done
		must.NoError(t, r.err)
		must.Eq(t, ds, r.res[0].Dataset)
		must.SliceLen(t, 1, setsOn(c.calls(), ds), must.Sprint("the Reserve's mark only"))
	})
}

// A prepared slot unmounted before its Reserve (by hand, say) is not
// handed over as prepared: as every handover, the prepared one checks the
// kernel's mount table, and the usual path mounts the dataset again. Found
// by a review: it used to hand over the bare mountpoint (the tenant would
// have written into the parent dataset), or, after a Sync, an empty path.
func TestPrepare_UnmountedSinceIsNotHandedOverAsIs(t *testing.T) {
	for _, withSync := range []bool{false, true} {
		t.Run(map[bool]string{false: "no read of ZFS since", true: "a Sync since"}[withSync], func(t *testing.T) {
			c := newPrepareCase(t, 1)
			B := owner(1)
			c.a.hold("scratch-0", B)
			c.prepare(t)
			s := slotByID(t, c.e, "scratch-0")
			c.e.pool.ZFS(t, "unmount", s.Dataset)
			if withSync {
				must.NoError(t, c.e.mgr.Sync(context.Background()))
			}
			r, err := c.reserve(t, 10*time.Second, "scratch-0")
			must.NoError(t, err)
			must.Eq(t, s.Dataset, r.res[0].Dataset)
			must.NotEq(t, "", r.res[0].Mountpoint)
			must.Eq(t, "yes", c.e.pool.Prop(t, r.res[0].Dataset, "mounted"))
			checkReadied(t, c.e, r.res[0].Mountpoint)
			must.Positive(t, r.views, must.Sprint("the usual path"))
		})
	}
}

// An allocation told to stop before its task asks has its device free to
// the scheduler already: no slot is prepared for it.
func TestPrepare_NotForAStoppingAllocation(t *testing.T) {
	c := newPrepareCase(t, 1)
	B := owner(1)
	c.a.hold("scratch-0", B)
	c.a.setStopping(B)
	c.prepare(t)
	s := slotByID(t, c.e, "scratch-0")
	must.Eq(t, record.StateFree, s.State)
	must.Eq(t, "free", stateOf(t, c.e, s.Dataset))
}

// TestReserve_AMarkThatLandedThoughItFailedIsUndone: the `zfs set` that
// marks a free dataset reserved, at placement or at Reserve, lands but is
// reported failed (cut short by its deadline after ZFS applied it). The
// dataset was handed to no one, so it is recorded free again: the next
// read finds it free and healthy, not reserved with an unknown owner
// (which would keep it from its asker until no allocation held it), and
// the asker's Reserve gets the same empty dataset.
func TestReserve_AMarkThatLandedThoughItFailedIsUndone(t *testing.T) {
	cases := []struct {
		name string
		mark func(t *testing.T, c *prepareCase) // the marking that fails
	}{
		{"prepared at placement", func(t *testing.T, c *prepareCase) {
			c.prepare(t) // logs the failure; its Reserve does the work
		}},
		{"at Reserve", func(t *testing.T, c *prepareCase) {
			_, err := c.reserve(t, 10*time.Second, "scratch-0")
			must.ErrorContains(t, err, "signal: killed")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newPrepareCase(t, 1)
			c.legacy(t) // an armed dataset is marked with no zfs command
			e, a := c.e, c.a
			ds := slotByID(t, e, "scratch-0").Dataset
			o := owner(70)
			a.hold("scratch-0", o)
			mark := record.PropState + "=reserved"
			c.w.FailAfterFor("set", mark, "signal: killed")

			tc.mark(t, c)
			must.Eq(t, []string{mark + " " + ds, record.PropState + "=free " + ds}, setsOn(c.calls(), ds),
				must.Sprint("the mark ran (and landed), then its undoing"))
			c.w.Unfail("set")
			must.Eq(t, "free", stateOf(t, e, ds), must.Sprint("the mark is undone on ZFS"))

			s := e.sync(t)[0]
			must.Eq(t, record.StateFree, s.State)
			must.True(t, s.Healthy, must.Sprint(s.HealthDesc))
			r, err := c.reserve(t, 10*time.Second, "scratch-0")
			must.NoError(t, err)
			must.Eq(t, ds, r.res[0].Dataset)
			entries, err := os.ReadDir(r.res[0].Mountpoint)
			must.NoError(t, err)
			must.SliceEmpty(t, entries)
		})
	}
}
