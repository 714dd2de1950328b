package slots_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// heldProof is the fake Nomad of allocs whose Holds (the proof of a
// prepared slot's asker) waits, once entered, until the test lets it go:
// a fault a real agent cannot be made to show on cue (a slow answer).
type heldProof struct {
	*allocs
	entered  chan struct{} // closed when the first Holds is entered
	let      chan struct{} // closed by the test: every Holds answers
	returned atomic.Bool   // a Holds has returned
	once     sync.Once
}

func newHeldProof(t *testing.T, a *allocs) *heldProof {
	t.Helper()
	h := &heldProof{allocs: a, entered: make(chan struct{}), let: make(chan struct{})}
	t.Cleanup(h.release)
	return h
}

func (h *heldProof) Holds(ctx context.Context, o record.Owner, ids []string) error {
	h.once.Do(func() { close(h.entered) })
	defer h.returned.Store(true)
	select {
	case <-h.let:
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.allocs.Holds(ctx, o, ids)
}

// release lets every Holds answer (once).
func (h *heldProof) release() {
	select {
	case <-h.let:
	default:
		close(h.let)
	}
}

// waitEntered returns once the proof read is under way.
func (h *heldProof) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the proof read never began")
	}
}

// onZFS is what ZFS records of dataset ds: its state, owner and guid.
func onZFS(t *testing.T, c *prepareCase, ds string) [3]string {
	t.Helper()
	p := c.e.pool
	return [3]string{p.Prop(t, ds, record.PropState), p.Prop(t, ds, record.PropOwner), c.e.guid(t, ds)}
}

// preparedAndHeld prepares scratch-0 for B (armed: in memory), puts the
// held proof in front of the fake Nomad and reserves scratch-0 for B. It
// returns once the Reserve has answered, the proof read still held open.
func preparedAndHeld(t *testing.T, n int, B record.Owner) (*prepareCase, *heldProof, slots.Slot) {
	t.Helper()
	c := newPrepareCase(t, n)
	c.a.hold("scratch-0", B)
	c.prepare(t)
	s := slotByID(t, c.e, "scratch-0")
	must.StrHasPrefix(t, "armed:", c.e.pool.Prop(t, s.Dataset, record.PropState))
	must.Eq(t, "", c.e.pool.Prop(t, s.Dataset, record.PropOwner), must.Sprint("no owner recorded before the proof"))

	h := newHeldProof(t, c.a)
	c.e.mgr.SetNomad(h)
	c.e.mgr.SetProofGrace(time.Minute)
	before := len(c.w.Calls())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.False(t, h.returned.Load(), must.Sprint("the Reserve answered before its proof read returned"))
	must.SliceLen(t, 1, res)
	must.Eq(t, s.Dataset, res[0].Dataset)
	must.Eq(t, B.AllocID, res[0].Owner.AllocID)
	h.waitEntered(t)
	must.SliceEmpty(t, setsOn(c.w.Calls()[before:], s.Dataset), must.Sprint("the Reserve of a prepared slot writes nothing"))
	return c, h, res[0]
}

// pending runs fn in a goroutine and returns a channel that gets its error.
func pending(fn func(ctx context.Context) error) <-chan error {
	out := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out <- fn(ctx)
	}()
	return out
}

// TestProof_AnsweredBeforeTheProofAndClosedUntilIt (issue 46): the
// Reserve of a prepared slot is answered before the read that proves its
// asker returns; until it does, the slot is closed: a release pass and a
// second Reserve of the device wait, the preparation leaves it alone, and
// ZFS records nothing of it (armed, no owner). Another slot's
// preparation does not wait for it. Once the proof answers, each goes on:
// the owner is recorded, and the second Reserve (the task restarted)
// gets the slot back through the usual proof.
func TestProof_AnsweredBeforeTheProofAndClosedUntilIt(t *testing.T) {
	B, D := owner(1), owner(2)
	c, h, got := preparedAndHeld(t, 2, B)
	e, a := c.e, c.a
	before := onZFS(t, c, got.Dataset)

	pass := pending(e.mgr.ReleaseEnded)
	type reserveResult struct {
		res []slots.Slot
		err error
	}
	second := make(chan reserveResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
		second <- reserveResult{res, err}
	}()
	// Another allocation placed on the other slot: its preparation does
	// not wait for this slot's proof; this slot is not prepared again.
	a.hold("scratch-1", D)
	c.prepare(t)
	must.Eq(t, D.AllocID, slotByID(t, e, "scratch-1").Owner.AllocID, must.Sprint("the other slot prepared meanwhile"))

	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-pass:
		t.Fatalf("the release pass did not wait for the proof (%v)", err)
	case r := <-second:
		t.Fatalf("the second Reserve did not wait for the proof (%v, %v)", r.res, r.err)
	default:
	}
	must.Eq(t, before, onZFS(t, c, got.Dataset), must.Sprint("nothing written while the proof is held"))
	must.StrHasPrefix(t, "armed:", before[0])
	must.Eq(t, "", before[1], must.Sprint("no owner before the proof"))
	must.SliceEmpty(t, archived(t, e))
	s := slotByID(t, e, "scratch-0")
	must.Eq(t, got.Dataset, s.Dataset)
	must.Eq(t, record.StateReserved, s.State)

	h.release()
	select {
	case err := <-pass:
		must.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the release pass never went on")
	}
	must.Eq(t, B.AllocID, recordedOwner(t, e, got.Dataset).AllocID, must.Sprint("the owner, recorded once proven"))
	var r reserveResult
	select {
	case r = <-second:
	case <-time.After(time.Minute):
		t.Fatal("the second Reserve never went on")
	}
	must.NoError(t, r.err)
	must.Eq(t, got.Dataset, r.res[0].Dataset, must.Sprint("its owner gets it back"))
	must.Eq(t, before[2], e.guid(t, r.res[0].Dataset))
	must.SliceEmpty(t, archived(t, e))
}

// TestProof_FailedProofKeepsTheData (issue 46): the prepared allocation is
// gone by the time the proof behind its Reserve reads it, while the task
// that got the slot wrote to it. Fail closed: the owner is unknown (none
// recorded on ZFS), the slot unhealthy saying why, and the data kept, in
// place, handed to no one else, while an allocation holds the device.
func TestProof_FailedProofKeepsTheData(t *testing.T) {
	B, C := owner(1), owner(2)
	c, h, got := preparedAndHeld(t, 1, B)
	e, a := c.e, c.a
	guid := e.guid(t, got.Dataset)
	must.NoError(t, os.WriteFile(filepath.Join(got.Mountpoint, "data.txt"), []byte("written by the asker"), 0o644))

	a.collect(B)           // gone by the time the proof reads it
	a.hold("scratch-0", C) // and another allocation on the device, started
	a.start(C)
	h.release()
	s := waitSlot(t, e, "scratch-0", "unhealthy once the proof failed", func(s slots.Slot) bool { return !s.Healthy })
	must.Eq(t, got.Dataset, s.Dataset)
	must.Eq(t, record.StateReserved, s.State)
	must.False(t, s.Owner.Known(), must.Sprint(s.Owner.String()))
	must.StrContains(t, s.HealthDesc, "owner unknown")
	must.StrContains(t, s.HealthDesc, "the proof failed")
	must.StrContains(t, s.HealthDesc, "its data is kept")

	// A release pass (which records the handover) keeps it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	s = slotByID(t, e, "scratch-0")
	must.Eq(t, got.Dataset, s.Dataset)
	must.False(t, s.Healthy)
	must.StrContains(t, s.HealthDesc, "owner unknown")
	must.Eq(t, "", e.pool.Prop(t, got.Dataset, record.PropOwner), must.Sprint("no owner recorded"))
	must.Eq(t, string(record.StateReserved), e.pool.Prop(t, got.Dataset, record.PropState), must.Sprint("its handover recorded, owner unknown"))

	// Handed to no one else: C's Reserve fails, the data stays in place.
	r, err := c.reserve(t, 2*time.Second, "scratch-0")
	must.Error(t, err)
	must.SliceEmpty(t, r.res)
	must.Eq(t, guid, e.guid(t, got.Dataset))
	b, err := os.ReadFile(filepath.Join(got.Mountpoint, "data.txt"))
	must.NoError(t, err)
	must.Eq(t, "written by the asker", string(b))
	must.SliceEmpty(t, archived(t, e), must.Sprint("not released while an allocation holds the device"))
}

// TestProof_CrashBeforeTheProofLeavesNoOwner (issue 46): a plugin stopped
// after answering a prepared slot's Reserve and before its proof answered
// leaves an armed dataset with no owner: the next run reads it reserved by
// an unknown allocation, never by the prepared one.
func TestProof_CrashBeforeTheProofLeavesNoOwner(t *testing.T) {
	B := owner(1)
	c, _, got := preparedAndHeld(t, 1, B)
	e, a := c.e, c.a
	must.NoError(t, os.WriteFile(filepath.Join(got.Mountpoint, "data.txt"), []byte("written by the asker"), 0o644))

	e.restart(t) // a new manager over the same pool; the old one's proof never answers
	e.mgr.SetNomad(a)
	s := e.sync(t)[0]
	must.StrHasPrefix(t, "armed:", e.pool.Prop(t, got.Dataset, record.PropState))
	must.Eq(t, "", e.pool.Prop(t, got.Dataset, record.PropOwner))
	must.Eq(t, got.Dataset, s.Dataset)
	must.Eq(t, record.StateReserved, s.State, must.Sprint("an earlier run's armed dataset: kept"))
	must.False(t, s.Owner.Known(), must.Sprint(s.Owner.String()))
}
