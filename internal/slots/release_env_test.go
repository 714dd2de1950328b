package slots_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// allocs stands in for the Nomad API at the slots.Nomad interface: which
// allocations hold each device, which have started, ended or are stopping.
// Every View is a new read (it began now). The API itself is tested in
// allocwatch, and the handover rules end to end with a real agent.
type allocs struct {
	mu       sync.Mutex
	holders  map[string][]record.Owner // by device, with the holding task
	ended    map[string]bool           // by allocation ID: complete
	stopping map[string]bool
	started  map[string]bool
	gone     map[string]bool // Gone answers yes for these
	err      error           // View fails with it
	goneErr  error           // Gone fails with it
	// incomplete, when set, is why the token may not see every namespace.
	incomplete string
	views      atomic.Int32
	holdsCalls atomic.Int32
}

func newAllocs() *allocs {
	return &allocs{holders: map[string][]record.Owner{}, ended: map[string]bool{}, stopping: map[string]bool{},
		started: map[string]bool{}, gone: map[string]bool{}}
}

func (a *allocs) View(ctx context.Context, since time.Time) (*slots.View, error) {
	a.views.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return nil, a.err
	}
	v := &slots.View{Began: time.Now(), Allocs: map[string]slots.Alloc{}, Complete: a.incomplete == "", Incomplete: a.incomplete}
	for dev, hs := range a.holders {
		for _, o := range hs {
			al, ok := v.Allocs[o.AllocID]
			if !ok {
				status := "running"
				if a.ended[o.AllocID] {
					status = "complete"
				}
				owner := o
				owner.Task = ""
				al = slots.Alloc{Owner: owner, ClientStatus: status, Stopping: a.stopping[o.AllocID],
					Devices: map[string]string{}, Dead: map[string]bool{}, Started: map[string]bool{}}
			}
			al.Devices[dev] = o.Task
			al.Started[o.Task] = a.started[o.AllocID]
			v.Allocs[o.AllocID] = al
		}
	}
	return v, nil
}

func (a *allocs) Latest(ctx context.Context) (*slots.View, error) { return a.View(ctx, time.Time{}) }

// Prior: the fake's allocations replace none (View names no previous
// allocation), so a restore never asks.
func (a *allocs) Prior(_ context.Context, _, allocID string) (slots.Prior, error) {
	return slots.Prior{}, fmt.Errorf("allocation %s: the fake replaces no allocation", allocID)
}

// Holds answers from the same state as View: o is live (not ended, not
// stopping) and holds every one of ids with its task.
func (a *allocs) Holds(ctx context.Context, o record.Owner, ids []string) error {
	a.holdsCalls.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	if a.ended[o.AllocID] || a.stopping[o.AllocID] {
		return fmt.Errorf("%s is not live", o)
	}
	for _, id := range ids {
		found := false
		for _, h := range a.holders[id] {
			found = found || h.AllocID == o.AllocID && h.Task == o.Task
		}
		if !found {
			return fmt.Errorf("%s does not hold %s", o, id)
		}
	}
	return nil
}

func (a *allocs) Incomplete(context.Context) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.incomplete
}

func (a *allocs) Gone(ctx context.Context, o record.Owner) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.goneErr != nil {
		return false, a.goneErr
	}
	return a.gone[o.AllocID], nil
}

// hold makes o a live holder of device id (beside any others).
func (a *allocs) hold(id string, o record.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holders[id] = append(a.holders[id], o)
}

// start marks o's task as started (it was handed its dataset).
func (a *allocs) start(o record.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.started[o.AllocID] = true
}

// end marks o complete: it stays in the node's list, holding nothing live.
func (a *allocs) end(o record.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ended[o.AllocID] = true
}

// collect makes o vanish from the node's list (garbage collected); Gone
// then answers yes for it.
func (a *allocs) collect(o record.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, hs := range a.holders {
		var keep []record.Owner
		for _, h := range hs {
			if h.AllocID != o.AllocID {
				keep = append(keep, h)
			}
		}
		a.holders[id] = keep
	}
	a.gone[o.AllocID] = true
}

func (a *allocs) setErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
}

// newReleaseEnv is an env of n slots whose manager learns about
// allocations from the returned allocs, synced once.
func newReleaseEnv(t *testing.T, n int) (*env, *allocs) {
	t.Helper()
	e := newEnv(t, n)
	a := newAllocs()
	e.mgr.SetNomad(a)
	e.sync(t)
	return e, a
}

func owner(n int) record.Owner {
	return record.Owner{AllocID: fmt.Sprintf("%08d-0000-0000-0000-000000000000", n), Namespace: "default",
		Job: "job", Group: "grp", Task: "task", AllocName: fmt.Sprintf("job.grp[%d]", n)}
}

// reserveAndWrite reserves device id for o (a new allocation holding it),
// writes a file into it as the started task would, and lets the manager
// record the owner.
func reserveAndWrite(t *testing.T, e *env, a *allocs, id string, o record.Owner) slots.Slot {
	t.Helper()
	a.hold(id, o)
	res, err := e.mgr.Reserve(context.Background(), []string{id})
	must.NoError(t, err)
	a.start(o)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("tenant "+o.AllocID), 0o644))
	// The spare made behind the Reserve holds the slot meanwhile; a pass
	// that finds the slot busy for longer than ownerLockWait leaves the
	// owner pending for the next pass (on a loaded machine, the spare's
	// zfs create can take that long). Let it finish first.
	must.NoError(t, e.mgr.Wait(context.Background()))
	must.NoError(t, e.mgr.ReleaseEnded(context.Background())) // records the owner
	must.Eq(t, o.AllocID, recordedOwner(t, e, res[0].Dataset).AllocID)
	// The spare is made once the owner is recorded (package armed).
	must.NoError(t, e.mgr.Wait(context.Background()))
	return res[0]
}

// withoutSpare is reserveAndWrite for a slot left without a spare: the
// `zfs create` that would make it fails (w, a wrapper first on PATH), so
// that the slot's next release is one that Reserve waits for.
func withoutSpare(t *testing.T, e *env, w *zfstest.Wrapper, a *allocs, id string, o record.Owner) slots.Slot {
	t.Helper()
	w.Fail("create", "cannot create: made to fail by the test")
	s := reserveAndWrite(t, e, a, id, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, e.mgr.Wait(ctx))
	w.Unfail("create")
	must.Eq(t, "", slotByID(t, e, id).Spare)
	return s
}

// stateOf is what the state recorded on dataset ds means to a reader
// outside the manager (slots.StateOf: a fresh dataset is recorded armed,
// and one in use shows its owner).
func stateOf(t *testing.T, e *env, ds string) string {
	t.Helper()
	return string(record.StateOf(e.pool.Prop(t, ds, record.PropState), e.pool.Prop(t, ds, record.PropOwner)))
}

// recordedOwner decodes the owner recorded on a dataset.
func recordedOwner(t *testing.T, e *env, ds string) record.Owner {
	t.Helper()
	o, err := record.DecodeOwner(e.pool.Prop(t, ds, record.PropOwner))
	must.NoError(t, err)
	return o
}

func archived(t *testing.T, e *env) []string {
	t.Helper()
	out := e.pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", e.cfg.ArchiveDataset())
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != e.cfg.ArchiveDataset() && l != "" {
			names = append(names, l)
		}
	}
	return names
}

// readArchived returns a file of an archived dataset, mounted for the
// read as docs/operations.md tells an operator to (zfstest.Pool.Look),
// and unmounted again on return.
func readArchived(t *testing.T, e *env, arch, file string) string {
	t.Helper()
	dir, unmount := e.pool.Look(t, arch)
	defer unmount()
	b, err := os.ReadFile(filepath.Join(dir, file))
	must.NoError(t, err)
	return string(b)
}

// checkFresh asserts that the slot is free, healthy, empty, and shows no
// snapshot of a previous tenant.
func checkFresh(t *testing.T, e *env, id string, oldGUID string) slots.Slot {
	t.Helper()
	var s slots.Slot
	for _, x := range e.mgr.Slots() {
		if x.ID == id {
			s = x
		}
	}
	must.Eq(t, id, s.ID)
	must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
	must.Eq(t, record.StateFree, s.State)
	must.NotEq(t, oldGUID, e.guid(t, s.Dataset))
	entries, err := os.ReadDir(s.Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
	snaps, _ := os.ReadDir(filepath.Join(s.Mountpoint, ".zfs", "snapshot"))
	must.SliceEmpty(t, snaps)
	must.Eq(t, "", e.pool.ZFS(t, "list", "-H", "-t", "snapshot", "-o", "name", "-r", s.Dataset))
	return s
}
