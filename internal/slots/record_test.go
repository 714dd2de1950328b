package slots_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// slowViews answers every View late while held: the API slow to read the
// node's allocations. held reports each View that waits.
type slowViews struct {
	*allocs
	mu   sync.Mutex
	gate chan struct{} // nil: views answer at once; else they wait for its close
	held chan struct{}
}

func (s *slowViews) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate, s.held = make(chan struct{}), make(chan struct{}, 16)
}

func (s *slowViews) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.gate)
	s.gate = nil
}

func (s *slowViews) View(ctx context.Context, since time.Time) (*slots.View, error) {
	s.mu.Lock()
	gate, held := s.gate, s.held
	s.mu.Unlock()
	if gate != nil {
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.allocs.View(ctx, since)
}

func (s *slowViews) Latest(ctx context.Context) (*slots.View, error) {
	return s.View(ctx, time.Time{})
}

// TestRecord_OwnerIdentifiedWhileTheHandoverIsRecorded (found by the
// churn bench): a held slot's armed spare is handed over before the
// Reserve's read has told who asked, so what is queued first is "handed
// over, owner unknown". When the owner loop writes that (its `zfs set`
// paused by a wrapper first on PATH) and the read lands meanwhile, the
// owner it identified is recorded afterwards: it is not dropped with the
// handover's record, which would leave the tenant's dataset kept as
// nobody's and the tenant's next Reserve refused.
func TestRecord_OwnerIdentifiedWhileTheHandoverIsRecorded(t *testing.T) {
	c := newSpareCase(t)
	w, e, a, o2, spare := c.w, c.e, c.a, c.o2, c.spare
	w.Resume("rename")
	must.StrHasPrefix(t, "armed:", e.pool.Prop(t, spare, record.PropState))
	e.mgr.SetSpareHold(time.Minute) // the zfs reads before the Reserve may outlast the default
	kickedPass(t, e, "scratch-0")   // Run goes on: its owner loop records what Reserve queues
	must.Eq(t, "reserved", stateOf(t, e, c.s0.Dataset), must.Sprint("held for the next tenant"))

	sv := &slowViews{allocs: a}
	e.mgr.SetNomad(sv)
	sv.hold()
	w.PauseFor("set", spare)
	a.hold("scratch-0", o2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := goReserve(ctx, e, "scratch-0")
	// The handover's record is under way (paused) while the Reserve's
	// read has not answered: both within identifyGrace (2 s).
	asked := time.Now()
	w.WaitPaused(t, "set", 1500*time.Millisecond)
	<-sv.held
	t.Logf("the handover's record paused %s after the Reserve began", time.Since(asked).Round(time.Millisecond))
	sv.release()
	r := <-got
	must.NoError(t, r.err)
	must.Eq(t, spare, r.res[0].Dataset)
	must.Eq(t, o2.AllocID, r.res[0].Owner.AllocID, must.Sprint("identified by the read made beside the handover"))

	w.Resume("set")
	must.NoError(t, e.mgr.Wait(ctx))
	// Recorded by the owner loop of Run, which goes on (or by this pass,
	// when the slot's lock is free within its short wait).
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return recordedOwner(t, e, spare).AllocID == o2.AllocID
	}), wait.Timeout(20*time.Second), wait.Gap(50*time.Millisecond)), must.Sprint("the owner identified is recorded"))

	// Read again from ZFS: the tenant's dataset, its owner known.
	must.NoError(t, e.mgr.Sync(ctx))
	s := slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateReserved, s.State)
	must.Eq(t, o2.AllocID, s.Owner.AllocID)
	must.True(t, s.Healthy, must.Sprint(s.HealthDesc))
}

// TestRecord_AStaleIdentificationIsNotRecordedOnTheNextTenant (review): a
// Reserve's read that identifies its asker, B, comes back late; meanwhile
// B has ended without starting, its dataset has been released, and the
// slot handed to C. What the read says of B belongs to a dataset that no
// longer serves: it must not replace C's pending owner, or B is recorded
// on C's dataset (and C's data later released as B's). B's Reserve fails
// instead, naming the slot.
func TestRecord_AStaleIdentificationIsNotRecordedOnTheNextTenant(t *testing.T) {
	e, g := newGatedEnv(t, true)
	g.late = true
	a := g.allocs
	B, C := owner(1), owner(3)
	a.hold("scratch-0", B)
	g.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gotB := goReserve(ctx, e, "scratch-0")
	<-g.entered // B's dataset is handed over; the read that names B is on its way back
	guidB := e.guid(t, slotByID(t, e, "scratch-0").Dataset)

	// B ends before it starts (its job stopped); its dataset is released,
	// and C is placed on the device and reserves it.
	a.end(B)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	a.hold("scratch-0", C)
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	dsC := res[0].Dataset
	must.NotEq(t, guidB, e.guid(t, dsC), must.Sprint("C gets a dataset of its own (perhaps of the same name)"))
	must.Eq(t, C.AllocID, res[0].Owner.AllocID)

	close(g.gate)
	r := <-gotB
	must.ErrorContains(t, r.err, "scratch-0", must.Sprint("B's Reserve fails: its dataset no longer serves"))
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.Eq(t, C.AllocID, recordedOwner(t, e, dsC).AllocID, must.Sprint("C's dataset is recorded as C's"))
	s := slotByID(t, e, "scratch-0")
	must.Eq(t, C.AllocID, s.Owner.AllocID)
}

// TestRecord_AStaleDecisionLeavesTheNextTenantsHealth (review): a release
// pass decides from a copy of the slots taken before its read of the API.
// Meanwhile B ends, C's Reserve releases B's dataset and takes the slot,
// and C's task starts. The pass, deciding for B's tenancy from a read
// showing B ended and C started on the device, finds a conflict: that is
// B's tenancy's, gone, and must not make C's slot unhealthy.
func TestRecord_AStaleDecisionLeavesTheNextTenantsHealth(t *testing.T) {
	e, g := newGatedEnv(t, false)
	a := g.allocs
	B, C := owner(1), owner(2)
	a.hold("scratch-0", B)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	a.start(B)
	must.NoError(t, e.mgr.ReleaseEnded(ctx)) // B's owner recorded

	// The pass takes its copy (B's tenancy) and waits on the API.
	passDone := gatedPass(ctx, e, g)

	a.end(B)
	a.hold("scratch-0", C)
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, C.AllocID, res[0].Owner.AllocID)
	a.start(C)

	close(g.gate)
	must.NoError(t, <-passDone)
	s := slotByID(t, e, "scratch-0")
	must.Eq(t, res[0].Dataset, s.Dataset)
	must.True(t, s.Healthy, must.Sprint("C's slot: ", s.HealthDesc))
	must.StrNotContains(t, s.HealthDesc, "conflict")
}
