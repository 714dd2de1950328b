package slots_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// allocs stands in for the Nomad API at the slots.Nomad interface: which
// allocations hold each device, which have started, ended or are stopping.
// Every View is a new read (it began now). The API itself is tested in
// allocwatch, and the handover rules end to end with a real agent.
type allocs struct {
	mu       sync.Mutex
	holders  map[string][]slots.Owner // by device, with the holding task
	ended    map[string]bool          // by allocation ID: complete
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
	return &allocs{holders: map[string][]slots.Owner{}, ended: map[string]bool{}, stopping: map[string]bool{},
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

// Holds answers from the same state as View: o is live (not ended, not
// stopping) and holds every one of ids with its task.
func (a *allocs) Holds(ctx context.Context, o slots.Owner, ids []string) error {
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

func (a *allocs) Gone(ctx context.Context, o slots.Owner) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.goneErr != nil {
		return false, a.goneErr
	}
	return a.gone[o.AllocID], nil
}

// hold makes o a live holder of device id (beside any others).
func (a *allocs) hold(id string, o slots.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holders[id] = append(a.holders[id], o)
}

// start marks o's task as started (it was handed its dataset).
func (a *allocs) start(o slots.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.started[o.AllocID] = true
}

// end marks o complete: it stays in the node's list, holding nothing live.
func (a *allocs) end(o slots.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ended[o.AllocID] = true
}

// collect makes o vanish from the node's list (garbage collected); Gone
// then answers yes for it.
func (a *allocs) collect(o slots.Owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, hs := range a.holders {
		var keep []slots.Owner
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

func owner(n int) slots.Owner {
	return slots.Owner{AllocID: fmt.Sprintf("%08d-0000-0000-0000-000000000000", n), Namespace: "default",
		Job: "job", Group: "grp", Task: "task", AllocName: fmt.Sprintf("job.grp[%d]", n)}
}

// reserveAndWrite reserves device id for o (a new allocation holding it),
// writes a file into it as the started task would, and lets the manager
// record the owner.
func reserveAndWrite(t *testing.T, e *env, a *allocs, id string, o slots.Owner) slots.Slot {
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
	// The spare is made once the owner is recorded (armed.go).
	must.NoError(t, e.mgr.Wait(context.Background()))
	return res[0]
}

// withoutSpare is reserveAndWrite for a slot left without a spare: the
// `zfs create` that would make it fails (w, a wrapper first on PATH), so
// that the slot's next release is one that Reserve waits for.
func withoutSpare(t *testing.T, e *env, w *zfstest.Wrapper, a *allocs, id string, o slots.Owner) slots.Slot {
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
	return string(slots.StateOf(e.pool.Prop(t, ds, slots.PropState), e.pool.Prop(t, ds, slots.PropOwner)))
}

// recordedOwner decodes the owner recorded on a dataset.
func recordedOwner(t *testing.T, e *env, ds string) slots.Owner {
	t.Helper()
	o, err := slots.DecodeOwner(e.pool.Prop(t, ds, slots.PropOwner))
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
	must.Eq(t, slots.StateFree, s.State)
	must.NotEq(t, oldGUID, e.guid(t, s.Dataset))
	entries, err := os.ReadDir(s.Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
	snaps, _ := os.ReadDir(filepath.Join(s.Mountpoint, ".zfs", "snapshot"))
	must.SliceEmpty(t, snaps)
	must.Eq(t, "", e.pool.ZFS(t, "list", "-H", "-t", "snapshot", "-o", "name", "-r", s.Dataset))
	return s
}

func TestRelease_ArchiveKeepsDataAndSlotComesBackFresh(t *testing.T) {
	e, a := newReleaseEnv(t, 2)
	o := owner(1)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	e.pool.ZFS(t, "snapshot", s.Dataset+"@operator-snap")
	guid := e.guid(t, s.Dataset)
	must.Eq(t, o, recordedOwner(t, e, s.Dataset))

	// Still running: nothing happens.
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, guid, e.guid(t, s.Dataset))
	must.SliceEmpty(t, archived(t, e))

	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	checkFresh(t, e, "scratch-0", guid)

	names := archived(t, e)
	must.SliceLen(t, 1, names)
	arch := names[0]
	must.StrContains(t, arch, ".archive/scratch-0.default.job.grp.task.00000001.")
	must.Eq(t, guid, e.guid(t, arch))
	must.Eq(t, "archived", stateOf(t, e, arch))
	must.Eq(t, "noauto", e.pool.Prop(t, arch, "canmount"))
	must.Eq(t, "no", e.pool.Prop(t, arch, "mounted"))
	must.Eq(t, o, recordedOwner(t, e, arch))
	// The release time is in the name (no property records it).
	must.Eq(t, "", e.pool.Prop(t, arch, slots.PropReleasedAt))
	// The data is intact: look inside as docs/operations.md says.
	must.Eq(t, "tenant "+o.AllocID, readArchived(t, e, arch, "data.txt"))

	// The slot is reusable: a second tenant gets the fresh dataset.
	o2 := owner(2)
	s2 := reserveAndWrite(t, e, a, "scratch-0", o2)
	must.Eq(t, o2.AllocID, recordedOwner(t, e, s2.Dataset).AllocID)
	// The untouched neighbour was never disturbed.
	must.Eq(t, slots.StateFree, e.mgr.Slots()[1].State)
}

// A release reads only the datasets it touches, by name. When one of them
// is missing (here the archive container, destroyed by hand) it falls back
// to a full Sync, which puts the container back, and the release completes
// with the data in the archive.
func TestRelease_FallsBackToFullSync(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	o := owner(1)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	e.pool.ZFS(t, "destroy", e.cfg.ArchiveDataset())

	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	checkFresh(t, e, "scratch-0", guid)
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, guid, e.guid(t, names[0]))
	must.Eq(t, "archived", stateOf(t, e, names[0]))
}

// treeReads counts the recursive reads of the whole tree.
type treeReads struct {
	slots.ZFS
	n atomic.Int32
}

func (c *treeReads) Get(ctx context.Context, name string, depth int, props ...string) ([]zfs.Dataset, error) {
	c.n.Add(1)
	return c.ZFS.Get(ctx, name, depth, props...)
}

// A release reads only what it touches, never the whole tree: so it costs
// the same at any number of slots. That holds for a slot that comes back
// fresh and for one beyond the configured count, which does not come back.
func TestRelease_NeverReadsTheTree(t *testing.T) {
	e, a := newReleaseEnv(t, 2)
	reads := &treeReads{ZFS: zfs.NewClient(e.runner)}
	e.mgr = slots.NewManager(reads, hclog.NewNullLogger())
	e.mgr.SetConfig(e.cfg)
	e.mgr.SetNomad(a)
	e.sync(t)
	o0, o1 := owner(1), owner(2)
	s0 := reserveAndWrite(t, e, a, "scratch-0", o0)
	reserveAndWrite(t, e, a, "scratch-1", o1)
	guid := e.guid(t, s0.Dataset)
	// Lower the count: scratch-1 is beyond it, kept until released.
	e.cfg.Classes[0].Slots = 1
	e.mgr.SetConfig(e.cfg)
	must.Eq(t, []string{"scratch-0", "scratch-1"}, ids(e.sync(t)))

	before := reads.n.Load()
	a.end(o0)
	a.end(o1)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, before, reads.n.Load(), must.Sprint("a release read the whole tree"))
	must.Eq(t, []string{"scratch-0"}, ids(e.mgr.Slots()))
	checkFresh(t, e, "scratch-0", guid)
	must.SliceLen(t, 2, archived(t, e))
	// A full sync sees the same.
	must.Eq(t, []string{"scratch-0"}, ids(e.sync(t)))
}

func TestRelease_Destroy(t *testing.T) {
	e := newEnv(t, 1)
	e.cfg.Classes[0].OnRelease = slots.OnReleaseDestroy
	e.mgr.SetConfig(e.cfg)
	a := newAllocs()
	e.mgr.SetNomad(a)
	e.sync(t)
	o := owner(3)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	e.pool.ZFS(t, "snapshot", s.Dataset+"@snap")
	guid := e.guid(t, s.Dataset)
	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	checkFresh(t, e, "scratch-0", guid)
	must.SliceEmpty(t, archived(t, e))
}

// Where the rename unmounts (OpenZFS: Capabilities.RenameUnmounts), the
// archive container mounts nothing and a release runs no `zfs unmount`:
// the rename into the archive is the unmount. Elsewhere (zfs-fuse) the
// release unmounts first. Either way the released dataset ends in the
// archive unmounted, not to be mounted by itself (canmount=noauto), its
// data kept, and the slot serves a fresh dataset.
func TestRelease_TheRenameUnmountsWhereItCan(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	if e.cfg.RenameUnmounts {
		must.Eq(t, "none", e.pool.Prop(t, e.cfg.ArchiveDataset(), "mountpoint"))
	}
	o := owner(5)
	s := withoutSpare(t, e, w, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	before := w.Count("unmount")
	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))

	unmounts := w.Count("unmount") - before
	if e.cfg.RenameUnmounts {
		must.Eq(t, 0, unmounts, must.Sprint("the rename into the archive unmounts"))
	} else {
		must.Eq(t, 1, unmounts, must.Sprint("zfs-fuse cannot rename a mounted dataset: unmounted first"))
	}
	got := archived(t, e)
	must.SliceLen(t, 1, got)
	must.Eq(t, guid, e.guid(t, got[0]))
	must.Eq(t, "no", e.pool.Prop(t, got[0], "mounted"))
	must.Eq(t, "noauto", e.pool.Prop(t, got[0], "canmount"))
	must.Eq(t, "archived", stateOf(t, e, got[0]))
	_, err := os.Stat(filepath.Join(s.Mountpoint, "data.txt"))
	must.ErrorIs(t, err, os.ErrNotExist, must.Sprint("nothing of the tenant's is left where its dataset was mounted"))
	checkFresh(t, e, "scratch-0", guid)
}

// A slot dataset given a mountpoint of its own by hand keeps it through a
// rename, and OpenZFS's rename mounts it again where that mountpoint says:
// the release unmounts it first on every ZFS, so that the archived data is
// mounted nowhere, neither at the hand-set path nor under the next tenant.
// That holds whether the plugin has read the mountpoint since it was set
// (the release's steps then say so) or not (the mount table shows the
// dataset mounted elsewhere, and the steps come from a read).
func TestRelease_HandSetMountpointIsUnmountedFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		read bool
	}{
		{name: "read since", read: true},
		{name: "set after the last read", read: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := zfstest.NewWrapper(t)
			w.SetPATH(t)
			e, a := newReleaseEnv(t, 1)
			if e.cfg.RenameUnmounts {
				must.Eq(t, "none", e.pool.Prop(t, e.cfg.ArchiveDataset(), "mountpoint"), must.Sprint("else the rename's mount would not matter"))
			}
			o := owner(6)
			s := withoutSpare(t, e, w, a, "scratch-0", o)
			guid := e.guid(t, s.Dataset)
			byHand := filepath.Join(t.TempDir(), "by-hand")
			e.pool.ZFS(t, "set", "mountpoint="+byHand, s.Dataset)
			// Registered after TempDir, so run before it is removed: a
			// failure must not leave the data mounted there.
			t.Cleanup(func() {
				for _, ds := range append(archived(t, e), s.Dataset) {
					if v, err := e.pool.TryProp(ds, "mounted"); err == nil && v == "yes" {
						_, _ = e.pool.Runner.ZFSCmd(context.Background(), "unmount", ds)
					}
				}
			})
			if tc.read {
				must.NoError(t, e.mgr.Sync(context.Background()))
			}
			_, err := os.Stat(filepath.Join(byHand, "data.txt"))
			must.NoError(t, err, must.Sprint("the tenant's data, mounted at the hand-set path"))

			before := w.Count("unmount")
			a.end(o)
			must.NoError(t, e.mgr.ReleaseEnded(context.Background()))

			got := archived(t, e)
			must.SliceLen(t, 1, got)
			must.Eq(t, guid, e.guid(t, got[0]))
			must.Eq(t, byHand, e.pool.Prop(t, got[0], "mountpoint"), must.Sprint("the rename keeps the hand-set mountpoint"))
			must.Eq(t, "no", e.pool.Prop(t, got[0], "mounted"), must.Sprint("the archived data is mounted nowhere"))
			must.Eq(t, "noauto", e.pool.Prop(t, got[0], "canmount"))
			must.Eq(t, "archived", stateOf(t, e, got[0]))
			_, err = os.Stat(filepath.Join(byHand, "data.txt"))
			must.ErrorIs(t, err, os.ErrNotExist, must.Sprint("nothing of the tenant's is left at the hand-set path"))
			must.Eq(t, 1, w.Count("unmount")-before, must.Sprint("a mountpoint of its own: unmounted before the rename"))
			must.Eq(t, "tenant "+o.AllocID, readArchived(t, e, got[0], "data.txt"), must.Sprint("the data is kept in the archive"))
			checkFresh(t, e, "scratch-0", guid)
		})
	}
}

// A dataset that a process still has open is never forced: the release
// waits, the data stays in place (canmount=noauto meanwhile), and the slot
// reports why while it serves a fresh dataset beside it.
func TestRelease_BusyIsRetriedNeverForced(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	o := owner(4)
	s := withoutSpare(t, e, w, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	holder := startHolder(t, s.Mountpoint)
	a.end(o)

	err := e.mgr.ReleaseEnded(context.Background())
	must.ErrorIs(t, err, zfs.ErrBusy)
	// A fresh dataset is made beside it, and serves meanwhile.
	got := e.mgr.Slots()[0]
	must.True(t, got.Healthy)
	must.StrContains(t, got.HealthDesc, "busy")
	must.NotEq(t, s.Dataset, got.Dataset)
	must.Eq(t, slots.StateFree, got.State)
	must.Eq(t, guid, e.guid(t, s.Dataset))
	must.Eq(t, "yes", e.pool.Prop(t, s.Dataset, "mounted"))
	must.Eq(t, "archived", stateOf(t, e, s.Dataset)) // its fate, recorded first
	// The plan sets canmount=noauto after the unmount; while the unmount
	// waits, it is set all the same, so that nothing mounts the released
	// data again by itself (a reboot, say).
	must.Eq(t, "noauto", e.pool.Prop(t, s.Dataset, "canmount"))
	_, err = os.Stat(filepath.Join(s.Mountpoint, "data.txt"))
	must.NoError(t, err)

	must.NoError(t, holder.Kill())
	_, _ = holder.Wait()
	must.NoError(t, e.mgr.Sync(context.Background()))
	checkFresh(t, e, "scratch-0", guid)
	must.SliceLen(t, 1, archived(t, e))
}

// crashAfter lets the first n changing zfs commands through to the real
// pool, then fails every later one, as if the plugin died right there.
type crashAfter struct {
	slots.ZFS
	n   int
	mu  sync.Mutex
	ops []string
}

var errCrash = errors.New("simulated crash")

func (c *crashAfter) step(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ops) >= c.n {
		return errCrash
	}
	c.ops = append(c.ops, op)
	return nil
}

func (c *crashAfter) Create(ctx context.Context, name string, props map[string]string) error {
	if err := c.step("create " + name); err != nil {
		return err
	}
	return c.ZFS.Create(ctx, name, props)
}

func (c *crashAfter) Set(ctx context.Context, name, prop, value string) error {
	if err := c.step("set " + prop + "=" + value + " " + name); err != nil {
		return err
	}
	return c.ZFS.Set(ctx, name, prop, value)
}

func (c *crashAfter) SetMany(ctx context.Context, name string, props map[string]string) error {
	if err := c.step(fmt.Sprintf("set %v %s", props, name)); err != nil {
		return err
	}
	return c.ZFS.SetMany(ctx, name, props)
}

func (c *crashAfter) Mount(ctx context.Context, name string) error {
	if err := c.step("mount " + name); err != nil {
		return err
	}
	return c.ZFS.Mount(ctx, name)
}

func (c *crashAfter) Unmount(ctx context.Context, name string) error {
	if err := c.step("unmount " + name); err != nil {
		return err
	}
	return c.ZFS.Unmount(ctx, name)
}

func (c *crashAfter) Rename(ctx context.Context, from, to string) error {
	if err := c.step("rename " + from); err != nil {
		return err
	}
	return c.ZFS.Rename(ctx, from, to)
}

func (c *crashAfter) DestroyRecursive(ctx context.Context, name, within string) error {
	if err := c.step("destroy -r " + name); err != nil {
		return err
	}
	return c.ZFS.DestroyRecursive(ctx, name, within)
}

// TestRelease_CrashBetweenEverySteps stops the release after each of its
// steps in turn (nothing of the dead plugin's memory survives: a new
// manager starts from what ZFS says), and checks that the next start
// finishes the job with the data intact in the archive.
func TestRelease_CrashBetweenEverySteps(t *testing.T) {
	for _, onRelease := range []string{slots.OnReleaseArchive, slots.OnReleaseDestroy} {
		// Steps: state (archived or destroying), unmount, canmount,
		// rename, create, then destroy -r (destroy).
		for n := 0; n <= 6; n++ {
			t.Run(fmt.Sprintf("%s/after_%d_steps", onRelease, n), func(t *testing.T) {
				e := newEnv(t, 1)
				e.cfg.Classes[0].OnRelease = onRelease
				e.mgr.SetConfig(e.cfg)
				a := newAllocs()
				e.mgr.SetNomad(a)
				e.sync(t)
				o := owner(5)
				s := reserveAndWrite(t, e, a, "scratch-0", o)
				guid := e.guid(t, s.Dataset)
				a.end(o)

				crash := &crashAfter{ZFS: zfs.NewClient(e.runner), n: n}
				dying := slots.NewManager(crash, hclog.NewNullLogger())
				dying.SetConfig(e.cfg)
				dying.SetNomad(a)
				must.NoError(t, dying.Sync(context.Background()))
				_ = dying.ReleaseEnded(context.Background())
				t.Logf("steps done before the crash: %q", crash.ops)

				// A new plugin process: it knows only what ZFS says.
				e.restart(t)
				e.mgr.SetNomad(a)
				must.NoError(t, e.mgr.Sync(context.Background()))
				must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
				checkFresh(t, e, "scratch-0", guid)
				names := archived(t, e)
				if onRelease == slots.OnReleaseDestroy {
					must.SliceEmpty(t, names)
					return
				}
				must.SliceLen(t, 1, names)
				must.Eq(t, guid, e.guid(t, names[0]))
				must.Eq(t, "archived", stateOf(t, e, names[0]))
			})
		}
	}
}

// Nomad may hand a slot to a new allocation while the previous one's data
// is still there: Reserve releases it first and answers with a fresh one,
// whose owner is the asker.
func TestReserve_WaitsForTheRelease(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	o, next := owner(6), owner(7)
	s := withoutSpare(t, e, w, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	a.end(o)
	a.hold("scratch-0", next)

	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	res, err := e.mgr.Reserve(rctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.NotEq(t, guid, e.guid(t, res[0].Dataset))
	entries, err := os.ReadDir(res[0].Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
	must.Eq(t, "reserved", stateOf(t, e, res[0].Dataset))
	must.SliceLen(t, 1, archived(t, e))
	// Made for the asker: its owner recorded by the command that created
	// it, and readied on the host as a free slot is (owner, mode, flags).
	must.Eq(t, next.AllocID, recordedOwner(t, e, res[0].Dataset).AllocID)
	checkReadied(t, e, res[0].Mountpoint)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, next.AllocID, recordedOwner(t, e, res[0].Dataset).AllocID)
}

// A plugin stopped right after it made a fresh dataset for the next tenant
// (`zfs create` with that tenant as owner, not yet readied on the host)
// leaves the dataset's root as zfs made it. The tenant's Reserve, repeated
// after the restart, gets it readied: the class owner and mode, and the
// mount flags.
func TestReserve_MadeForItsOwnerIsReadiedAfterARestart(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	next := owner(8)
	s := slotByID(t, e, "scratch-0")
	// What the stopped plugin left: reserved for next, root as zfs made it.
	e.pool.ZFS(t, "set", slots.PropOwner+"="+next.Encode(), s.Dataset)
	e.pool.ZFS(t, "set", slots.PropState+"=reserved", s.Dataset)
	must.NoError(t, os.Chown(s.Mountpoint, 0, 0))
	must.NoError(t, os.Chmod(s.Mountpoint, 0o755))

	e.restart(t)
	e.mgr.SetNomad(a)
	must.NoError(t, e.mgr.Sync(context.Background()))
	a.hold("scratch-0", next)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	checkReadied(t, e, res[0].Mountpoint)
}

// checkReadied checks that a slot's mount is readied for a tenant as a free
// slot is: its root has the class owner and mode, and the mount carries
// the class's flags.
func checkReadied(t *testing.T, e *env, mountpoint string) {
	t.Helper()
	c := e.cfg.Classes[0]
	fi, err := os.Stat(mountpoint)
	must.NoError(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	must.Eq(t, uint32(c.UID), st.Uid)
	must.Eq(t, uint32(c.GID), st.Gid)
	must.Eq(t, c.Mode, fi.Mode().Perm())
	table, err := hostfs.ReadTable()
	must.NoError(t, err)
	mnt, ok := table.At(mountpoint)
	must.True(t, ok)
	must.True(t, mnt.Satisfies(hostfs.FlagsFor(c.SlotProps())), must.Sprintf("%+v", mnt))
}

// The recorded owner asking again (the sole live holder) gets its own
// dataset back, data and all.
func TestReserve_RepeatByTheOwner(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	o := owner(12)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	res, err := e.mgr.Reserve(context.Background(), []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	_, err = os.Stat(filepath.Join(res[0].Mountpoint, "data.txt"))
	must.NoError(t, err)
}

// While the owner is still stopping (desired stop, task not dead yet),
// Nomad may already give its device to a new allocation: that Reserve waits
// for the owner to end, and never shares the live tenant's dataset.
func TestReserve_NewAllocationWaitsForAStoppingOwner(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.mgr.Run(ctx, time.Hour)
	o, next := owner(10), owner(11)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)

	a.mu.Lock()
	a.stopping[o.AllocID] = true
	a.mu.Unlock()
	a.hold("scratch-0", next)
	short, shortCancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer shortCancel()
	_, err := e.mgr.Reserve(short, []string{"scratch-0"})
	must.ErrorContains(t, err, "which is stopping")
	must.ErrorContains(t, err, "scratch-0")
	must.Eq(t, guid, e.guid(t, s.Dataset))

	// Once the owner has ended, the new allocation gets a fresh dataset.
	go func() {
		time.Sleep(500 * time.Millisecond)
		a.end(o)
		e.mgr.Kick()
	}()
	long, longCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer longCancel()
	res, err := e.mgr.Reserve(long, []string{"scratch-0"})
	must.NoError(t, err)
	must.NotEq(t, guid, e.guid(t, res[0].Dataset))
	entries, err := os.ReadDir(res[0].Mountpoint)
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, next.AllocID, recordedOwner(t, e, res[0].Dataset).AllocID)
}

// slotByID returns the manager's view of one slot.
func slotByID(t *testing.T, e *env, id string) slots.Slot {
	t.Helper()
	for _, s := range e.mgr.Slots() {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("no slot %s in %v", id, ids(e.mgr.Slots()))
	return slots.Slot{}
}

// Fail closed: whenever the manager cannot prove who may have a used
// dataset, it keeps the data, refuses the handover with an error that
// names the slot and why, and reports the slot unhealthy.
func TestReserve_FailsClosed(t *testing.T) {
	cases := []struct {
		name string
		// setup runs after o reserved and wrote scratch-0; next then asks.
		setup   func(a *allocs, o, next slots.Owner)
		wantErr string
		// wantHealth is in the slot's health after a release pass.
		wantHealth string
	}{{
		name: "API unreachable",
		setup: func(a *allocs, o, next slots.Owner) {
			a.end(o)
			a.setErr(errors.New("dial tcp 127.0.0.1:4646: connection refused"))
		},
		wantErr:    "cannot be read to verify the asker (dial tcp 127.0.0.1:4646: connection refused)",
		wantHealth: "owner unverified: the node's allocations cannot be read",
	}, {
		name: "owner in a namespace the token cannot read",
		setup: func(a *allocs, o, next slots.Owner) {
			a.collect(o) // not in the node's list as the token sees it
			a.mu.Lock()
			a.goneErr = errors.New("permission denied by the Nomad API: 403")
			a.incomplete = `the token cannot read jobs in namespace "other"`
			a.mu.Unlock()
		},
		wantErr:    "the token may not see every namespace (see the warning), so who else holds the device cannot be known",
		wantHealth: "owner unverified",
	}, {
		name: "owner's allocation cannot be looked up",
		setup: func(a *allocs, o, next slots.Owner) {
			a.collect(o)
			a.mu.Lock()
			a.goneErr = errors.New("permission denied by the Nomad API: 403")
			a.mu.Unlock()
		},
		wantErr:    "whose state cannot be read (permission denied by the Nomad API: 403)",
		wantHealth: "owner unverified",
	}, {
		name:       "owner still running",
		setup:      func(a *allocs, o, next slots.Owner) {},
		wantErr:    "still in use by allocation 00000020",
		wantHealth: "still in use by allocation 00000020",
	}, {
		name: "two live holders besides the ended owner",
		setup: func(a *allocs, o, next slots.Owner) {
			a.end(o)
			a.hold("scratch-0", owner(99))
		},
		wantErr:    "conflict: 2 live allocations hold the device",
		wantHealth: "", // the background pass may release: neither has started
	}, {
		name: "ended owner, but another holder has started",
		setup: func(a *allocs, o, next slots.Owner) {
			a.end(o)
			a.start(next)
		},
		wantErr:    "conflict: allocation 00000020",
		wantHealth: "conflict: allocation 00000020",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, a := newReleaseEnv(t, 1)
			o, next := owner(20), owner(21)
			s := reserveAndWrite(t, e, a, "scratch-0", o)
			guid := e.guid(t, s.Dataset)
			a.hold("scratch-0", next)
			tc.setup(a, o, next)

			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
			must.ErrorContains(t, err, "device scratch-0")
			must.ErrorContains(t, err, tc.wantErr)
			must.Less(t, 5*time.Second, time.Since(start), must.Sprint("Reserve must return at its deadline"))
			if tc.wantHealth != "" {
				_ = e.mgr.ReleaseEnded(context.Background())
				got := slotByID(t, e, "scratch-0")
				must.False(t, got.Healthy, must.Sprint(got.HealthDesc))
				must.StrContains(t, got.HealthDesc, tc.wantHealth)
			}
			// The data stayed where it was, with its owner.
			must.Eq(t, guid, e.guid(t, s.Dataset))
			must.Eq(t, o.AllocID, recordedOwner(t, e, s.Dataset).AllocID)
			b, err := os.ReadFile(filepath.Join(s.Mountpoint, "data.txt"))
			must.NoError(t, err)
			must.Eq(t, "tenant "+o.AllocID, string(b))
		})
	}
}

// A fresh slot reserved while the API is down is handed over (it is empty),
// but its owner is unknown: the slot is unhealthy, nobody else gets it, and
// it is released only once a complete view shows no allocation holds it.
func TestReserve_OwnerUnknownIsKeptUntilNobodyHoldsIt(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	o := owner(30)
	a.hold("scratch-0", o)
	a.setErr(errors.New("connection refused"))
	res, err := e.mgr.Reserve(context.Background(), []string{"scratch-0"})
	must.NoError(t, err)
	a.start(o)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("secret"), 0o644))
	guid := e.guid(t, res[0].Dataset)
	got := slotByID(t, e, "scratch-0")
	must.False(t, got.Healthy)
	must.StrContains(t, got.HealthDesc, "owner unknown")

	// The API is back; o has ended and next holds the device. The owner
	// was never identified, so next is refused and the data kept.
	a.setErr(nil)
	a.end(o)
	next := owner(31)
	a.hold("scratch-0", next)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err = e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.ErrorContains(t, err, "owner unknown")
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, guid, e.guid(t, res[0].Dataset))

	// A token that may not see every namespace proves nothing either.
	a.collect(next)
	a.mu.Lock()
	a.incomplete = "limited token"
	a.mu.Unlock()
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	got = slotByID(t, e, "scratch-0")
	must.StrContains(t, got.HealthDesc, "limited token")

	// Nothing holds it and the view is complete: released, as unknown.
	a.mu.Lock()
	a.incomplete = ""
	a.mu.Unlock()
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	checkFresh(t, e, "scratch-0", guid)
	names := archived(t, e)
	must.SliceLen(t, 1, names)
	must.Eq(t, guid, e.guid(t, names[0]))
}

// With the parent gone, nothing is released, renamed or destroyed, however
// ended the owner is.
func TestRelease_NothingWhenParentMissing(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	o := owner(9)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	a.end(o)
	cfg := e.cfg
	cfg.Parent = e.pool.Dataset("elsewhere")
	e.mgr.SetConfig(cfg)
	must.NoError(t, e.mgr.Sync(context.Background()))
	for _, sl := range e.mgr.Slots() {
		must.False(t, sl.Healthy)
		must.StrContains(t, sl.HealthDesc, "does not exist")
	}
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.Eq(t, guid, e.guid(t, s.Dataset))
	must.Eq(t, "reserved", stateOf(t, e, s.Dataset))
	must.SliceEmpty(t, archived(t, e))
}

// cachedAllocs is allocs behind a cache, as the watcher serves views: a
// View whose since is no later than the cached read's start is answered
// from the cache; otherwise it is a new read, cached.
type cachedAllocs struct {
	*allocs
	mu     sync.Mutex
	cached *slots.View
	reads  int         // new reads
	sinces []time.Time // every since asked for
}

func (c *cachedAllocs) View(ctx context.Context, since time.Time) (*slots.View, error) {
	c.mu.Lock()
	c.sinces = append(c.sinces, since)
	if c.cached != nil && !c.cached.Began.Before(since) {
		v := c.cached
		c.mu.Unlock()
		return v, nil
	}
	c.reads++
	c.mu.Unlock()
	v, err := c.allocs.View(ctx, since)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.cached = v
	c.mu.Unlock()
	return v, nil
}

func (c *cachedAllocs) counts() (reads int, latest time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sinces {
		if s.After(latest) {
			latest = s
		}
	}
	return c.reads, latest
}

// A pass that a kick starts decides from the latest read only when that
// read began after the latest Reserve arrived and no reserved slot's owner
// is unknown: a read from before shows no holder of a device just handed
// out, and a read that misses the holder (made under a token since
// widened) would have an owner never identified taken for gone. Otherwise
// a newer read is reused, not read again.
func TestRun_KickedPassDecidesFromNoReadOlderThanTheLatestReserve(t *testing.T) {
	e := newEnv(t, 2)
	a := &cachedAllocs{allocs: newAllocs()}
	e.mgr.SetNomad(a)
	e.sync(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.mgr.Run(ctx, time.Hour)
	asked := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.sinces)
	}
	// kick kicks a pass and waits until it has asked for a view (or
	// archived something) and the work it started is done.
	kick := func() {
		t.Helper()
		n := asked()
		e.mgr.Kick()
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			return asked() > n || len(archived(t, e)) > 0
		}), wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)), must.Sprint("the kicked pass asks for a view"))
		must.NoError(t, e.mgr.Wait(ctx))
	}

	// Known owners only: a read newer than the latest Reserve is reused.
	p := owner(41)
	sp := reserveAndWrite(t, e, a.allocs, "scratch-1", p)
	_, err := a.View(ctx, time.Now())
	must.NoError(t, err)
	reads, _ := a.counts()
	kick()
	after, _ := a.counts()
	must.Eq(t, reads, after, must.Sprint("a read that began after the latest Reserve is reused"))

	// A read from before the next Reserve: nothing holds scratch-0.
	_, err = a.View(ctx, time.Now())
	must.NoError(t, err)
	// o is handed the fresh slot while the API fails: its owner is never
	// identified. o writes.
	o := owner(40)
	a.hold("scratch-0", o)
	a.setErr(errors.New("connection refused"))
	arrived := time.Now()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	a.start(o)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("o's"), 0o644))
	guid := e.guid(t, res[0].Dataset)
	must.NoError(t, e.mgr.Wait(ctx))
	a.setErr(nil)
	kick()
	must.SliceEmpty(t, archived(t, e), must.Sprint("o's data was taken for no one's"))
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	must.StrContains(t, slotByID(t, e, "scratch-0").HealthDesc, "owner unknown")
	_, latest := a.counts()
	must.False(t, latest.Before(arrived), must.Sprint("the kicked pass asked for a read that began after the Reserve"))

	// A read after the Reserve that misses o (as one made under a token
	// that could not see o's namespace would): the pass reads anew.
	a.mu.Lock()
	a.allocs.mu.Lock()
	a.allocs.holders["scratch-0"] = nil
	a.allocs.mu.Unlock()
	a.mu.Unlock()
	_, err = a.View(ctx, time.Now())
	must.NoError(t, err)
	a.hold("scratch-0", o)
	kick()
	must.SliceEmpty(t, archived(t, e), must.Sprint("o's data was taken for no one's"))
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	must.Eq(t, sp.Dataset, slotByID(t, e, "scratch-1").Dataset)
}
