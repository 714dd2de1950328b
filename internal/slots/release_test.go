package slots_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

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
	must.Eq(t, archivedCanmount(e), e.pool.Prop(t, arch, "canmount"))
	must.Eq(t, "no", e.pool.Prop(t, arch, "mounted"))
	must.Eq(t, o, recordedOwner(t, e, arch))
	// The release time is in the name (no property records it).
	must.Eq(t, "", e.pool.Prop(t, arch, record.PropReleasedAt))
	// The data is intact: look inside as docs/operations.md says.
	must.Eq(t, "tenant "+o.AllocID, readArchived(t, e, arch, "data.txt"))

	// The slot is reusable: a second tenant gets the fresh dataset.
	o2 := owner(2)
	s2 := reserveAndWrite(t, e, a, "scratch-0", o2)
	must.Eq(t, o2.AllocID, recordedOwner(t, e, s2.Dataset).AllocID)
	// The untouched neighbour was never disturbed.
	must.Eq(t, record.StateFree, e.mgr.Slots()[1].State)
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
// release unmounts first, with `zfs set canmount=off`. Either way the
// released dataset ends in the archive unmounted, not to be mounted by
// itself (canmount=noauto where the rename unmounts, canmount=off where
// the release did), its data kept, and the slot serves a fresh dataset.
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
	before := unmounts(w, s.Dataset)
	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))

	n := unmounts(w, s.Dataset) - before
	if e.cfg.RenameUnmounts {
		must.Eq(t, 0, n, must.Sprint("the rename into the archive unmounts"))
	} else {
		must.Eq(t, 1, n, must.Sprint("zfs-fuse cannot rename a mounted dataset: unmounted first"))
	}
	got := archived(t, e)
	must.SliceLen(t, 1, got)
	must.Eq(t, guid, e.guid(t, got[0]))
	must.Eq(t, "no", e.pool.Prop(t, got[0], "mounted"))
	must.Eq(t, archivedCanmount(e), e.pool.Prop(t, got[0], "canmount"))
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

			before := unmounts(w, s.Dataset)
			a.end(o)
			must.NoError(t, e.mgr.ReleaseEnded(context.Background()))

			got := archived(t, e)
			must.SliceLen(t, 1, got)
			must.Eq(t, guid, e.guid(t, got[0]))
			must.Eq(t, byHand, e.pool.Prop(t, got[0], "mountpoint"), must.Sprint("the rename keeps the hand-set mountpoint"))
			must.Eq(t, "no", e.pool.Prop(t, got[0], "mounted"), must.Sprint("the archived data is mounted nowhere"))
			must.Eq(t, "off", e.pool.Prop(t, got[0], "canmount"), must.Sprint("unmounted by canmount=off"))
			must.Eq(t, "archived", stateOf(t, e, got[0]))
			_, err = os.Stat(filepath.Join(byHand, "data.txt"))
			must.ErrorIs(t, err, os.ErrNotExist, must.Sprint("nothing of the tenant's is left at the hand-set path"))
			must.Eq(t, 1, unmounts(w, s.Dataset)-before, must.Sprint("a mountpoint of its own: unmounted before the rename"))
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
	must.Eq(t, record.StateFree, got.State)
	must.Eq(t, guid, e.guid(t, s.Dataset))
	must.Eq(t, "yes", e.pool.Prop(t, s.Dataset, "mounted"))
	must.Eq(t, "archived", stateOf(t, e, s.Dataset)) // its fate, recorded first
	// The unmount (canmount=off) records nothing while it is refused;
	// canmount=noauto is set meanwhile, so that nothing mounts the
	// released data again by itself (a reboot, say).
	must.Eq(t, "noauto", e.pool.Prop(t, s.Dataset, "canmount"))
	_, err = os.Stat(filepath.Join(s.Mountpoint, "data.txt"))
	must.NoError(t, err)

	must.NoError(t, holder.Kill())
	_, _ = holder.Wait()
	must.NoError(t, e.mgr.Sync(context.Background()))
	checkFresh(t, e, "scratch-0", guid)
	must.SliceLen(t, 1, archived(t, e))
}

// unmounts counts the unmounts of ds that w saw: a release's `zfs set
// canmount=off ds`, which unmounts the dataset (reconcile.ReleaseSteps),
// and any `zfs unmount ds`.
func unmounts(w *zfstest.Wrapper, ds string) int {
	n := 0
	for _, c := range w.Calls() {
		if c.Cmd == "zfs" && (slices.Equal(c.Args, []string{"set", "canmount=off", ds}) || slices.Equal(c.Args, []string{"unmount", ds})) {
			n++
		}
	}
	return n
}

// archivedCanmount is the canmount of a dataset released into the archive
// of e: canmount=noauto where the rename unmounts it (OpenZFS), off where
// the release unmounts it first (zfs-fuse).
func archivedCanmount(e *env) string {
	if e.cfg.RenameUnmounts {
		return "noauto"
	}
	return "off"
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
		// Steps: state (archived or destroying), the unmount
		// (canmount=off; on OpenZFS canmount=noauto), rename, create,
		// then destroy -r (destroy).
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
