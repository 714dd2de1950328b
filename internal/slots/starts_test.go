package slots_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// startsCase is two slots, scratch-0 with a spare and its tenant o1 ended,
// scratch-1 fresh, a manager that yields to a task's start for yield, and
// a wrapper first on PATH that pauses the `zfs rename` of o1's dataset.
type startsCase struct {
	w     *zfstest.Wrapper
	e     *env
	a     *allocs
	o1    record.Owner
	s0    slots.Slot // as o1 had it
	spare string
	// running: the manager's loops run (recordedWithin).
	running bool
}

func newStartsCase(t *testing.T, yield time.Duration) *startsCase {
	t.Helper()
	c := &startsCase{w: zfstest.NewWrapper(t), o1: owner(1)}
	c.w.SetPATH(t)
	c.e, c.a = newReleaseEnv(t, 2)
	c.e.mgr.SetStartYield(yield)
	c.s0, c.spare = withSpare(t, c.e, c.a, "scratch-0", c.o1)
	// The yield the Reserve above began is over before the case starts.
	time.Sleep(yield)
	c.a.end(c.o1)
	c.w.PauseFor("rename", c.s0.Dataset)
	return c
}

// recordedWithin runs the manager's loops (Run) until the test ends, and
// waits until o is recorded as the owner of dataset ds, no later than by.
func (c *startsCase) recordedWithin(t *testing.T, ds string, o record.Owner, by time.Time) {
	t.Helper()
	if !c.running {
		c.running = true
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { defer close(ran); c.e.mgr.Run(ctx, time.Hour) }()
		t.Cleanup(func() { cancel(); <-ran })
		c.e.mgr.Kick()
	}
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return recordedOwner(t, c.e, ds).AllocID == o.AllocID
	}), wait.Timeout(time.Until(by)), wait.Gap(50*time.Millisecond)),
		must.Sprintf("the owner %s of %s not recorded in time", o, ds))
}

// reserve reserves id for o and returns how long the Reserve took.
func (c *startsCase) reserve(t *testing.T, id string, o record.Owner) (slots.Slot, time.Duration) {
	t.Helper()
	c.a.hold(id, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := c.e.mgr.Reserve(ctx, []string{id})
	took := time.Since(start)
	must.NoError(t, err, must.Sprintf("Reserve of %s for %s after %s", id, o, took))
	must.SliceLen(t, 1, res)
	return res[0], took
}

// TestStarts_ReleaseYieldsToATaskStart (issue 10): once a Reserve has
// handed a slot's spare to its next tenant, whose task starts then, the
// ended tenant's dataset is archived behind it, but its zfs work outside
// the slot's lock waits until the start's yield is over: the rename comes
// no sooner. A Reserve on another slot meanwhile, and the new tenant's
// owner record, wait for none of it.
func TestStarts_ReleaseYieldsToATaskStart(t *testing.T) {
	// Long enough that the owner's record, two real zfs commands behind
	// the handover, comes well within its first half on a loaded machine.
	const yield = 8 * time.Second
	c := newStartsCase(t, yield)
	o2, o3 := owner(2), owner(3)

	got, took := c.reserve(t, "scratch-0", o2)
	handed := time.Now()
	must.Eq(t, c.spare, got.Dataset)
	must.Less(t, yield/2, took, must.Sprint("the handover of an armed spare waits for no yield"))

	// A fresh slot's Reserve during the yield: it waits for nothing.
	_, took = c.reserve(t, "scratch-1", o3)
	t.Logf("fresh Reserve during the yield took %s", took.Round(time.Millisecond))
	must.Less(t, yield/2, took, must.Sprint("a Reserve waited for the yield to a task's start"))

	// The owner of the handover is recorded by the owners' loop during
	// the yield (recordOwner takes the slot's lock for at most 100 ms:
	// nothing that yields holds it).
	c.recordedWithin(t, c.spare, o2, handed.Add(yield/2))

	// The old dataset's rename comes once the yield is over.
	c.archivedAfter(t, handed, yield, "its spare's handover")
}

// archivedAfter waits for the paused rename of o1's dataset, checks that
// it came no sooner than yield after since (the moment what names), lets
// it go, and checks that o1's data is in the archive once the manager's
// background work is over.
func (c *startsCase) archivedAfter(t *testing.T, since time.Time, yield time.Duration, what string) {
	t.Helper()
	c.w.WaitPaused(t, "rename", 30*time.Second)
	after := time.Since(since)
	t.Logf("the rename of the ended tenant's dataset came %s after %s", after.Round(time.Millisecond), what)
	must.GreaterEq(t, yield-500*time.Millisecond, after, must.Sprint("the release did not yield to the task's start"))
	c.w.Resume("rename")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, c.e.mgr.Wait(ctx))
	names := archived(t, c.e)
	must.SliceLen(t, 1, names)
	must.Eq(t, "tenant "+c.o1.AllocID, readArchived(t, c.e, names[0], "data.txt"))
}

// TestStarts_AReserveNeverWaitsForAYield (issue 10): a Reserve that needs
// a release still yielding to a task's start (the slot's next tenant
// ended before its predecessor's dataset was archived: no spare yet) has
// it go on at once, and is answered long before the yield would end.
func TestStarts_AReserveNeverWaitsForAYield(t *testing.T) {
	const yield = time.Minute
	c := newStartsCase(t, 2*time.Second)
	o2, o3 := owner(2), owner(3)
	c.e.mgr.SetStartYield(yield)
	c.w.Resume("rename")

	got, _ := c.reserve(t, "scratch-0", o2)
	must.Eq(t, c.spare, got.Dataset)
	c.recordedWithin(t, c.spare, o2, time.Now().Add(10*time.Second))
	c.a.end(o2)
	// o1's dataset, its fate written, is still where it was: its release
	// yields for a minute. o3's Reserve has it go on, then gets a fresh
	// dataset.
	must.Eq(t, "archived", stateOf(t, c.e, c.s0.Dataset))
	got, took := c.reserve(t, "scratch-0", o3)
	t.Logf("Reserve behind a yielding release took %s", took.Round(time.Millisecond))
	must.Less(t, 15*time.Second, took)
	entries, err := os.ReadDir(got.Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries, must.Sprint("o3 gets a fresh dataset"))
	// The release of o2's dataset yields to o3's start: set to 0, the
	// yield under way ends.
	c.e.mgr.SetStartYield(0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, c.e.mgr.Wait(ctx))
	must.SliceLen(t, 2, archived(t, c.e), must.Sprint("o1's and o2's datasets archived"))
}

// TestStarts_AHeldSlotsReleaseYieldsFromTheReserve (issue 10): a slot
// held for its next tenant (a kicked pass found its owner ended) is handed
// over by the Reserve as a fresh slot is, its asker identified by a read
// made beside the handover, and the release behind the handover starts
// before the Reserve is answered: it yields from the Reserve's arrival,
// so that its rename comes no sooner than the yield's end.
func TestStarts_AHeldSlotsReleaseYieldsFromTheReserve(t *testing.T) {
	const yield = 3 * time.Second
	c := newStartsCase(t, yield)
	c.e.mgr.SetSpareHold(time.Minute) // the zfs reads before the Reserve may outlast the default
	kickedPass(t, c.e, "scratch-0")
	must.Eq(t, "reserved", stateOf(t, c.e, c.s0.Dataset), must.Sprint("held for the next tenant"))
	// The read that identifies the asker takes a while (a busy Nomad
	// server): the release behind the handover starts well before the
	// Reserve is answered.
	sv := &slowViews{allocs: c.a}
	sv.hold()
	c.e.mgr.SetNomad(sv)
	arrived := time.Now()
	time.AfterFunc(yield/2, sv.release)
	got, _ := c.reserve(t, "scratch-0", owner(2))
	must.Eq(t, c.spare, got.Dataset)
	c.archivedAfter(t, arrived, yield, "the Reserve arrived")
}
