package slots_test

// Red-team tests for issue 9 ("Fail closed"): each reproduced, before its
// fix, a path where the plugin handed a written dataset over without proof
// or released one under a live tenant; now each pins the fix. They use the
// fake allocs of release_env_test.go at the slots.Nomad interface and a real
// pool.

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

// setIncomplete makes every later view incomplete: the token does not see
// every namespace, so allocations of some namespaces are left out.
func (a *allocs) setIncomplete(why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.incomplete = why
}

func (a *allocs) setStopping(o record.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopping[o.AllocID] = true
}

// tenantFile says whether the file a tenant wrote is at the slot's current
// mountpoint.
func tenantFile(t *testing.T, mountpoint string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mountpoint, "data.txt"))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// Owner A (namespace default, visible) is stopping but still running; Nomad
// freed its device (desired status stop) and placed B, in a namespace the
// token cannot see, on it. B's Reserve arrives. The view is incomplete, so
// it cannot prove who asks: A is the sole *visible* holder, not the sole
// holder. Reserve must refuse (DESIGN 3, 3b; issue 9 §1 "namespace
// invisible"). Then, once A ends, the release pass must not release the
// dataset that B is now using.
func TestRedTeam_IncompleteView_RepeatReserveHandsOwnerDataToInvisibleAsker(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	A := owner(1)
	s := reserveAndWrite(t, e, a, "scratch-0", A)
	guid := e.guid(t, s.Dataset)

	a.setIncomplete(`the token cannot read jobs in namespace "other"`)
	a.setStopping(A)
	// B (namespace "other") holds scratch-0 now, but the token cannot see it.

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	if err == nil {
		got, leaked := tenantFile(t, res[0].Mountpoint)
		t.Errorf("Reserve handed %s (guid %s) to an asker it cannot identify; A's file visible to the asker: %v %q",
			res[0].Dataset, e.guid(t, res[0].Dataset), leaked, got)
		// B, unseen, works in it.
		must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "b.txt"), []byte("tenant B"), 0o644))
	}

	// A ends. B (invisible) still runs; the pass must keep the dataset.
	a.end(A)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	cur := slotByID(t, e, "scratch-0")
	if e.guid(t, cur.Dataset) != guid || cur.State != record.StateReserved {
		t.Errorf("the dataset was released under the invisible running tenant: state %s, slot guid %s (was %s), archive %v",
			cur.State, e.guid(t, cur.Dataset), guid, archived(t, e))
	}
}

// A fresh slot; C (namespace default, visible) was placed on scratch-0 but
// stopped before it started (desired stop, client status still pending), so
// Nomad placed B, in a namespace the token cannot see, on the same device.
// B's Reserve: the only *visible* holder is C, and reserveFresh records C
// as the owner. When C ends, the release pass archives (or destroys) the
// dataset while B runs in it. With an incomplete view the owner must stay
// unknown, and the dataset be kept.
func TestRedTeam_IncompleteView_FreshSlotOwnerMisidentified(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	C := owner(3)
	a.setIncomplete(`the token cannot read jobs in namespace "other"`)
	a.hold("scratch-0", C)
	a.setStopping(C)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"}) // B asks
	must.NoError(t, err)                                  // a fresh slot is empty: handing it over is fine
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("tenant B"), 0o644))
	guid := e.guid(t, res[0].Dataset)

	must.NoError(t, e.mgr.ReleaseEnded(context.Background())) // records the owner
	if o := e.pool.Prop(t, res[0].Dataset, record.PropOwner); o != "-" && o != "" {
		t.Errorf("owner recorded from an incomplete view (the sole visible holder is not proof): %q", o)
	}

	a.end(C)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	cur := slotByID(t, e, "scratch-0")
	if e.guid(t, cur.Dataset) != guid || cur.State != record.StateReserved {
		t.Errorf("B's dataset was released while B runs: state %s, archive %v", cur.State, archived(t, e))
	}
}

// gatedAllocs blocks the first call of Incomplete (made by ReleaseEnded
// after it took its copy of the owners identified at Reserve, and before it
// records them) until gate is closed: the API answering slowly (the
// visibility check has a 15 s deadline).
type gatedAllocs struct {
	*allocs
	onView bool // gate the first View instead of the first Incomplete
	// late: that View reads at once and hands its answer back at the
	// gate, so that what it says is older than when it arrives.
	late    bool
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedAllocs) wait() {
	if !g.armed.Load() {
		return
	}
	block := false
	g.once.Do(func() { block = true })
	if block {
		close(g.entered)
		<-g.gate
	}
}

func (g *gatedAllocs) Incomplete(ctx context.Context) string {
	if !g.onView {
		g.wait()
	}
	return g.allocs.Incomplete(ctx)
}

func (g *gatedAllocs) View(ctx context.Context, since time.Time) (*slots.View, error) {
	if g.onView && g.late {
		v, err := g.allocs.View(ctx, since)
		g.wait()
		return v, err
	}
	if g.onView {
		g.wait()
	}
	return g.allocs.View(ctx, since)
}

// The owners identified at Reserve are copied at the start of ReleaseEnded
// and recorded later. Meanwhile B ends and C's Reserve releases B's
// dataset and hands C the fresh one. recordOwner then stamps B (the stale
// copy) on C's dataset (it checks only "reserved, no owner stamped"), and
// the same pass, seeing B ended and C not yet started in the servers' view
// (a task start reaches the servers after Reserve returns), releases C's
// dataset under C.
func TestRedTeam_StalePendingOwnerStampedOnNextGeneration(t *testing.T) {
	for _, onView := range []bool{false, true} {
		t.Run(map[bool]string{false: "slow visibility check", true: "slow allocation read"}[onView], func(t *testing.T) {
			stalePendingOwner(t, onView)
		})
	}
}

// newGatedEnv is an env of one slot whose manager learns about
// allocations from a gatedAllocs (its gate not armed yet), synced once.
func newGatedEnv(t *testing.T, onView bool) (*env, *gatedAllocs) {
	t.Helper()
	e := newEnv(t, 1)
	g := &gatedAllocs{allocs: newAllocs(), onView: onView, entered: make(chan struct{}), gate: make(chan struct{})}
	e.mgr.SetNomad(g)
	e.sync(t)
	return e, g
}

// gatedPass arms g's gate and starts a release pass (ReleaseEnded), and
// returns, with its outcome to come, once the pass waits at the gate: it
// has taken its copy of the slots (and of the owners to record).
func gatedPass(ctx context.Context, e *env, g *gatedAllocs) <-chan error {
	g.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- e.mgr.ReleaseEnded(ctx) }()
	<-g.entered
	return done
}

func stalePendingOwner(t *testing.T, onView bool) {
	e, g := newGatedEnv(t, onView)
	a := g.allocs
	B, C := owner(1), owner(2)

	// B reserves the fresh slot; its owner is identified, not yet recorded.
	a.hold("scratch-0", B)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	a.start(B)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("tenant B"), 0o644))

	// The background pass starts and waits on the API.
	passDone := gatedPass(context.Background(), e, g)

	// B ends; C is placed on the device and its Reserve arrives.
	a.end(B)
	a.hold("scratch-0", C)
	res2, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	_, leaked := tenantFile(t, res2[0].Mountpoint)
	must.False(t, leaked, must.Sprint("C must get a fresh dataset"))
	must.NoError(t, os.WriteFile(filepath.Join(res2[0].Mountpoint, "data.txt"), []byte("tenant C"), 0o644))
	guidC := e.guid(t, res2[0].Dataset)
	// C has not started yet in the servers' view.

	close(g.gate)
	if err := <-passDone; err != nil {
		// Two archives of "B" released within one second have the same
		// name: the second rename fails, and fails again on every retry
		// (the name derives from the stored released-at).
		t.Errorf("release pass: %v", err)
		must.NoError(t, e.mgr.Sync(context.Background()))
	}

	if o, err := record.DecodeOwner(e.pool.Prop(t, res2[0].Dataset, record.PropOwner)); err == nil && o.AllocID == B.AllocID {
		t.Errorf("B's owner (a stale copy) was recorded on C's dataset")
	}
	cur := slotByID(t, e, "scratch-0")
	if e.guid(t, cur.Dataset) != guidC || cur.State != record.StateReserved {
		t.Errorf("C's dataset was released right after it was handed to C: state %s, archive %v", cur.State, archived(t, e))
	}
	for _, name := range archived(t, e) {
		if e.guid(t, name) != guidC {
			continue
		}
		if o := recordedOwner(t, e, name); o.AllocID != C.AllocID {
			t.Errorf("C's data is archived as %s's: %s", o.AllocID[:8], name)
		}
	}
}

// Pinned safe: with a complete view, a stopping-but-not-ended C and the
// asker B both hold the fresh slot's device: two live holders, so the owner
// stays unknown (never C), the slot is unhealthy, and when C ends the pass
// keeps the dataset while B holds it.
func TestRedTeam_Safe_FreshSlotTwoVisibleHoldersOwnerUnknown(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	B, C := owner(1), owner(3)
	a.hold("scratch-0", C)
	a.setStopping(C)
	a.hold("scratch-0", B)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	a.start(B)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("tenant B"), 0o644))
	guid := e.guid(t, res[0].Dataset)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, "", e.pool.Prop(t, res[0].Dataset, record.PropOwner))
	s := slotByID(t, e, "scratch-0")
	must.False(t, s.Healthy)
	must.StrContains(t, s.HealthDesc, "owner unknown")

	a.end(C)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	s = slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateReserved, s.State)
	must.Eq(t, guid, e.guid(t, s.Dataset))
}

// A repeated Reserve by the recorded owner hands over the dataset without
// checking that it is mounted: after the dataset is unmounted behind the
// plugin's back (an orphaned zfs child, an operator), Reserve returns a
// path that is a bare directory on the class dataset (or, once Sync saw
// it, an empty path). Issue 9 §6: "Reserve never returns an unmounted path".
func TestRedTeam_RepeatReserveReturnsUnmountedPath(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	A := owner(1)
	s := reserveAndWrite(t, e, a, "scratch-0", A)
	e.pool.ZFS(t, "unmount", s.Dataset)

	for _, synced := range []bool{false, true} {
		if synced {
			e.sync(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
		cancel()
		if err != nil {
			continue
		}
		mounted := e.pool.Prop(t, s.Dataset, "mounted")
		if res[0].Mountpoint == "" || mounted != "yes" {
			t.Errorf("synced=%v: Reserve returned host path %q while %s is mounted=%s", synced, res[0].Mountpoint, s.Dataset, mounted)
		}
	}
}
