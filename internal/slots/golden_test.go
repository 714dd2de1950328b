package slots_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// golden makes dataset <pool>/golden holding seed.txt = content, and its
// snapshot @name, which it returns.
func golden(t *testing.T, e *env, name, content string) string {
	t.Helper()
	ds := e.pool.Dataset("golden")
	if _, err := e.pool.TryProp(ds, "guid"); err != nil {
		e.pool.ZFS(t, "create", ds)
	}
	must.NoError(t, os.WriteFile(filepath.Join(e.pool.Prop(t, ds, "mountpoint"), "seed.txt"), []byte(content), 0o644))
	e.pool.ZFS(t, "snapshot", ds+"@"+name)
	return ds + "@" + name
}

func readSeed(t *testing.T, mp string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mp, "seed.txt"))
	must.NoError(t, err)
	return string(b)
}

// A class with a source: fresh slots are clones of it, with the class's
// quota, owner and mode; a tenant's writes reach neither the snapshot nor
// the next tenant; a new source is used by free slots at the next sync
// and by a slot in use once it is released; then the old snapshot can be
// destroyed.
func TestGolden_ClonesTheSourceAndFollowsItsChanges(t *testing.T) {
	e := newEnv(t, 2)
	v1 := golden(t, e, "v1", "golden v1")
	e.cfg.Classes[0].Source = v1
	e.cfg.Classes[0].OnRelease = slots.OnReleaseDestroy
	e.mgr.SetConfig(e.cfg)
	a := newAllocs()
	e.mgr.SetNomad(a)
	for _, s := range e.sync(t) {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
		must.Eq(t, v1, e.pool.Prop(t, s.Dataset, "origin"))
		must.Eq(t, v1, s.Origin)
		must.Eq(t, "golden v1", readSeed(t, s.Mountpoint))
		must.Eq(t, "67108864", e.pool.Prop(t, s.Dataset, "refquota"))
		fi, err := os.Stat(s.Mountpoint)
		must.NoError(t, err)
		must.Eq(t, os.FileMode(0o770), fi.Mode().Perm())
	}

	// A tenant overwrites the golden file: the snapshot and the next
	// tenant still see the golden one.
	var err error
	o := owner(1)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	must.NoError(t, os.WriteFile(filepath.Join(s.Mountpoint, "seed.txt"), []byte("tenant"), 0o644))
	look := e.pool.Dataset("look")
	e.pool.ZFS(t, "clone", v1, look) // zfs-fuse has no .zfs/snapshot
	must.Eq(t, "golden v1", readSeed(t, e.pool.Prop(t, look, "mountpoint")))
	e.pool.ZFS(t, "destroy", look)

	// The operator moves the class to v2: the free slot is made again
	// from it at the next sync, the one in use keeps v1.
	v2 := golden(t, e, "v2", "golden v2")
	e.cfg.Classes[0].Source = v2
	e.mgr.SetConfig(e.cfg)
	e.sync(t)
	free := slotByID(t, e, "scratch-1")
	must.Eq(t, v2, e.pool.Prop(t, free.Dataset, "origin"))
	must.Eq(t, "golden v2", readSeed(t, free.Mountpoint))
	inUse := slotByID(t, e, "scratch-0")
	must.Eq(t, s.Dataset, inUse.Dataset)
	must.Eq(t, v1, inUse.Origin)
	must.Eq(t, "tenant", readSeed(t, inUse.Mountpoint))
	// Its spare, made from v1 before the change, is made again too.
	must.NotEq(t, "", inUse.Spare)
	must.Eq(t, v2, e.pool.Prop(t, inUse.Spare, "origin"))

	// v1 is held by the slot in use: zfs refuses to destroy it.
	_, err = e.pool.Runner.ZFSCmd(context.Background(), "destroy", v1)
	must.Error(t, err)

	// The tenant ends: its dataset is destroyed, the next tenant gets v2,
	// and the operator can destroy v1.
	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	must.NoError(t, e.mgr.Wait(context.Background()))
	e.sync(t)
	next := slotByID(t, e, "scratch-0")
	must.Eq(t, record.StateFree, next.State)
	must.Eq(t, v2, next.Origin)
	must.Eq(t, "golden v2", readSeed(t, next.Mountpoint))
	e.pool.ZFS(t, "destroy", v1)

	// The operator renames the snapshot the class names: the free
	// datasets now read as made from another one, and the class's source
	// does not exist. They are kept (unhealthy, saying why), never
	// destroyed for a source that cannot be cloned.
	v3 := e.pool.Dataset("golden") + "@v3"
	before := e.guid(t, next.Dataset)
	e.pool.ZFS(t, "rename", v2, v3)
	err = e.mgr.Sync(context.Background())
	must.ErrorContains(t, err, "source "+v2+" cannot be read, so the free dataset is kept")
	kept := slotByID(t, e, "scratch-0")
	must.Eq(t, before, e.guid(t, kept.Dataset))
	must.False(t, kept.Healthy)
	must.StrContains(t, kept.HealthDesc, "so the free dataset is kept")
	// The class follows the rename: nothing to make again.
	e.cfg.Classes[0].Source = v3
	e.mgr.SetConfig(e.cfg)
	for _, s := range e.sync(t) {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
	}
	must.Eq(t, before, e.guid(t, slotByID(t, e, "scratch-0").Dataset))

	// Without a source, slots are empty again.
	e.cfg.Classes[0].Source = ""
	e.mgr.SetConfig(e.cfg)
	for _, s := range e.sync(t) {
		must.Eq(t, "", s.Origin)
		entries, err := os.ReadDir(s.Mountpoint)
		must.NoError(t, err)
		must.SliceEmpty(t, entries)
	}
}
