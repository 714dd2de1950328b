package slots_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// waitSlot syncs until cond holds for slot id, for up to a minute (zfs-fuse
// updates space figures only when a transaction group commits).
func waitSlot(t *testing.T, e *env, id string, what string, cond func(slots.Slot) bool) slots.Slot {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_ = e.mgr.Sync(context.Background())
		s := slotByID(t, e, id)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: slot %s is %s, healthy=%v: %s", what, id, s.State, s.Healthy, s.HealthDesc)
		}
		time.Sleep(time.Second)
	}
}

// fill writes into a file of its own (dir/name) until the pool says it is full (or
// max bytes), and returns the file's path; "" when the pool was too full
// to make the file at all.
func fill(t *testing.T, dir, name string, max int64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if errors.Is(err, syscall.ENOSPC) {
		return "" // full already (OpenZFS 2.1 refuses even the new file)
	}
	must.NoError(t, err)
	defer f.Close()
	// Random data: no compression (OpenZFS compresses by default) shrinks it.
	buf := make([]byte, 1<<20)
	_, err = rand.Read(buf)
	must.NoError(t, err)
	var n int64
	for n < max {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			break
		}
	}
	_ = f.Sync()
	return path
}

// Scenario "full pool": a free slot is offered healthy only while the pool
// can give its tenant the class quota, and the health text says both
// figures; a release that ZFS refuses for lack of space keeps the data and
// makes the slot unhealthy with why, and goes on once space is freed.
func TestFaults_FullPool(t *testing.T) {
	e, a := newReleaseEnvOn(t, 2, 256<<20, 100<<20)
	filler := e.pool.Dataset("filler")
	e.pool.ZFS(t, "create", "-o", "compression=off", filler)
	o := owner(50)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	guid := e.guid(t, s.Dataset)
	must.True(t, slotByID(t, e, "scratch-1").Healthy)

	// Leave less than the quota: the free slot is not offered.
	fillDir := e.pool.Prop(t, filler, "mountpoint")
	fillPath := fill(t, fillDir, "a", 150<<20)
	free := waitSlot(t, e, "scratch-1", "free slot unhealthy on a nearly full pool", func(s slots.Slot) bool { return !s.Healthy })
	must.StrContains(t, free.HealthDesc, "available, less than the class quota 100.0MiB")
	must.StrContains(t, free.HealthDesc, "pool "+e.pool.Name+" has ")

	// Full to the brim: on zfs-fuse the release cannot even start, and
	// the data stays. OpenZFS keeps a slop of the pool for such metadata
	// changes and may carry the release out instead (the data then goes
	// to the archive, checked below); where it refuses, the same holds.
	fill2 := fill(t, fillDir, "b", 1<<30)
	a.end(o)
	_, kernel := os.Stat("/dev/zfs")
	deadline := time.Now().Add(time.Minute)
	blocked := false
	for {
		err := e.mgr.ReleaseEnded(context.Background())
		got := slotByID(t, e, "scratch-0")
		if err != nil && errors.Is(err, zfs.ErrNoSpace) {
			must.False(t, got.Healthy)
			must.StrContains(t, got.HealthDesc, "release blocked")
			blocked = true
			break
		}
		if kernel == nil && got.State != record.StateReserved {
			break // released from the slop space
		}
		if got.State != record.StateReserved || time.Now().After(deadline) {
			t.Fatalf("release on a full pool: err=%v, slot %s %v %q", err, got.State, got.Healthy, got.HealthDesc)
		}
		time.Sleep(2 * time.Second)
	}
	if blocked {
		must.Eq(t, guid, e.guid(t, s.Dataset))
		b, err := os.ReadFile(filepath.Join(s.Mountpoint, "data.txt"))
		must.NoError(t, err)
		must.Eq(t, "tenant "+o.AllocID, string(b))
	}

	// Space freed: the release completes and both slots come back.
	for _, p := range []string{fillPath, fill2} {
		if p != "" {
			must.NoError(t, os.Remove(p))
		}
	}
	e.pool.ZFS(t, "destroy", filler)
	deadline = time.Now().Add(2 * time.Minute)
	for {
		_ = e.mgr.ReleaseEnded(context.Background())
		_ = e.mgr.Sync(context.Background())
		if got := slotByID(t, e, "scratch-0"); got.State == record.StateFree && got.Healthy {
			break
		}
		if time.Now().After(deadline) {
			got := slotByID(t, e, "scratch-0")
			t.Fatalf("after freeing space: slot %s %v %q", got.State, got.Healthy, got.HealthDesc)
		}
		time.Sleep(2 * time.Second)
	}
	checkFresh(t, e, "scratch-0", guid)
	must.SliceLen(t, 1, archived(t, e))
}

// newReleaseEnvOn is newReleaseEnv on a pool of poolSize bytes with a class
// quota of quota bytes.
func newReleaseEnvOn(t *testing.T, n int, poolSize int64, quota uint64) (*env, *allocs) {
	t.Helper()
	e := newEnvSized(t, n, poolSize)
	e.cfg.Classes[0].Quota = quota
	e.mgr.SetConfig(e.cfg)
	a := newAllocs()
	e.mgr.SetNomad(a)
	e.sync(t)
	return e, a
}

// Scenario "control characters": names from Nomad are stored encoded, and
// a dataset carrying raw control characters (written by an earlier version
// or by hand) makes only its own slot unhealthy: the rest of the node is
// read, offered and released as usual.
func TestFaults_ControlCharacters(t *testing.T) {
	e, a := newReleaseEnv(t, 3)
	evil := record.Owner{AllocID: "0e0e0e0e-0000-0000-0000-000000000000", Namespace: "default",
		Job: "job\twith\ttabs", Group: "grp\nwith\nnewlines", Task: "t\x00\x1b[31m", AllocName: "job\twith\ttabs.grp\n[0]"}
	s := reserveAndWrite(t, e, a, "scratch-0", evil)
	must.Eq(t, evil, recordedOwner(t, e, s.Dataset))
	value := e.pool.Prop(t, s.Dataset, record.PropOwner)
	must.False(t, strings.ContainsAny(value, "\t\n\x00\x1b"), must.Sprintf("stored raw: %q", value))

	// An earlier version's raw values, with a forged line in them.
	legacy := e.cfg.SlotDataset("scratch", 1)
	forged := fmt.Sprintf("x\n%s\tnomad-device-zfs:state\tfree\tlocal", e.cfg.SlotDataset("scratch", 2))
	e.pool.ZFS(t, "set", record.PropState+"=reserved", legacy)
	e.pool.ZFS(t, "set", "nomad-device-zfs:job="+forged, legacy)
	e.pool.ZFS(t, "set", "nomad-device-zfs:group=a\tb", legacy)

	// The first batched read does not parse around scratch-1; the exact
	// re-read recovers every dataset (the forged line names scratch-2, which
	// keeps its real values) and rewrites the raw values, so the next
	// batched read parses. scratch-1's owner was never known: it is kept.
	got := e.sync(t)
	must.Eq(t, []string{"scratch-0", "scratch-1", "scratch-2"}, ids(got))
	must.True(t, slotByID(t, e, "scratch-2").Healthy, must.Sprint(slotByID(t, e, "scratch-2").HealthDesc))
	must.Eq(t, record.StateFree, slotByID(t, e, "scratch-2").State)
	for _, p := range []string{"nomad-device-zfs:job", "nomad-device-zfs:group"} {
		v, err := zfs.NewClient(e.runner).GetExact(context.Background(), legacy, p)
		must.NoError(t, err)
		must.False(t, strings.ContainsAny(v.Value, "\t\n"), must.Sprintf("%s still raw: %q", p, v.Value))
	}
	ds, err := zfs.NewClient(e.runner).Get(context.Background(), e.cfg.Parent, 2, slots.ObservedProps...)
	must.NoError(t, err)
	for _, d := range ds {
		must.NoError(t, d.Err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err = e.mgr.Reserve(ctx, []string{"scratch-1"})
	must.ErrorContains(t, err, "owner unknown")

	// The rest of the node works: a reservation and a release. And since
	// no allocation holds scratch-1 and the view is complete, its unknown
	// owner has positively ended: it is archived too.
	o := owner(51)
	reserveAndWrite(t, e, a, "scratch-2", o)
	a.end(evil)
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	names := archived(t, e)
	must.SliceLen(t, 2, names)
	var evilArchive string
	for _, n := range names {
		must.NoError(t, zfs.ValidateDatasetName(n))
		if recordedOwner(t, e, n) == evil {
			evilArchive = n
		}
	}
	must.NotEq(t, "", evilArchive, must.Sprintf("no archive of %s in %v", evil, names))
	checkFresh(t, e, "scratch-0", "")
	checkFresh(t, e, "scratch-1", "")
}

// Scenario "orphaned zfs child", the host half: a free slot that is not
// mounted (unmounted behind the plugin's back) is never handed over, and
// is mounted again by the next sync before it is offered.
func TestFaults_UnmountedFreeSlot(t *testing.T) {
	e, a := newReleaseEnv(t, 1)
	s := slotByID(t, e, "scratch-0")
	e.pool.ZFS(t, "unmount", s.Dataset)
	a.hold("scratch-0", owner(52))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.ErrorContains(t, err, "nothing is mounted there")
	must.Eq(t, "free", stateOf(t, e, s.Dataset))

	got := waitSlot(t, e, "scratch-0", "remounted", func(s slots.Slot) bool { return s.Healthy })
	must.Eq(t, "yes", e.pool.Prop(t, s.Dataset, "mounted"))
	res, err := e.mgr.Reserve(context.Background(), []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, got.Mountpoint, res[0].Mountpoint)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "probe"), []byte("x"), 0o644))
}
