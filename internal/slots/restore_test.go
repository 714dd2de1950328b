package slots_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// newRestoreEnv is newReleaseEnv for one class with restore set, whose
// manager finds archives through a real retention.Pruner.
func newRestoreEnv(t *testing.T, n int, restore string) (*env, *allocs) {
	t.Helper()
	e := newEnv(t, n)
	e.cfg.Classes[0].Restore = restore
	e.mgr.SetConfig(e.cfg)
	p := retention.New(zfs.NewClient(e.runner), hclog.NewNullLogger())
	p.SetConfig(retention.Config{Container: e.cfg.ArchiveDataset(), Rules: retention.Rules{Default: retention.Policy{Keep: 3}}})
	e.mgr.SetArchives(p)
	a := newAllocs()
	e.mgr.SetNomad(a)
	e.sync(t)
	return e, a
}

// tenant is an allocation of job.grp[index] (one identity per index).
func tenant(n, index int) record.Owner {
	o := owner(n)
	o.AllocName = "job.grp[" + itoa(index) + "]"
	return o
}

// archivedTenant reserves device id for o, writes into it, ends o and
// waits for its dataset to be archived, the only archive; it returns the
// dataset's guid.
func archivedTenant(t *testing.T, e *env, a *allocs, id string, o record.Owner) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := reserveAndWrite(t, e, a, id, o)
	guid := e.guid(t, s.Dataset)
	a.end(o)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	must.SliceLen(t, 1, archived(t, e))
	return guid
}

// newWrappedRestoreEnv is newRestoreEnv for one slot of a best-effort
// class, with a zfs wrapper first on PATH.
func newWrappedRestoreEnv(t *testing.T) (*zfstest.Wrapper, *env, *allocs) {
	t.Helper()
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newRestoreEnv(t, 1, slots.RestoreBestEffort)
	return w, e, a
}

// archivedGUIDs returns the guids of the datasets in the archive.
func archivedGUIDs(t *testing.T, e *env) []string {
	t.Helper()
	var out []string
	for _, n := range archived(t, e) {
		out = append(out, e.guid(t, n))
	}
	return out
}

func readData(t *testing.T, s slots.Slot) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Mountpoint, "data.txt"))
	if os.IsNotExist(err) {
		return ""
	}
	must.NoError(t, err)
	return string(b)
}

func TestRestore_ReplacementGetsItsPredecessorsData(t *testing.T) {
	e, a := newRestoreEnv(t, 2, slots.RestoreRequired)
	ctx := context.Background()

	// Stop and run: the first tenant ends, its dataset is archived; the
	// next allocation of the same identity gets it back by a rename.
	first := tenant(1, 0)
	guid := archivedTenant(t, e, a, "scratch-0", first)

	second := tenant(2, 0)
	a.hold("scratch-0", second)
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	got := res[0]
	must.Eq(t, "tenant "+first.AllocID, readData(t, got))
	must.Eq(t, guid, e.guid(t, got.Dataset), must.Sprint("a rename, not a copy"))
	must.Eq(t, second.AllocID, recordedOwner(t, e, got.Dataset).AllocID)
	must.Eq(t, "reserved", stateOf(t, e, got.Dataset))
	must.Eq(t, "on", e.pool.Prop(t, got.Dataset, "canmount"))
	must.Eq(t, "67108864", e.pool.Prop(t, got.Dataset, "refquota"))
	must.Eq(t, first.AllocID, e.pool.Prop(t, got.Dataset, record.PropDataFrom), must.Sprint("where its data came from"))
	must.SliceEmpty(t, archived(t, e))
	// The fresh dataset it replaced is the slot's spare.
	cur := slotByID(t, e, "scratch-0")
	must.Eq(t, got.Dataset, cur.Dataset)
	must.NotEq(t, "", cur.Spare)
	must.Eq(t, "free", stateOf(t, e, cur.Spare))
	a.start(second)

	// A job update: the replacement asks while the dataset is still in
	// the slot; it keeps it in place, data and all.
	must.NoError(t, os.WriteFile(filepath.Join(got.Mountpoint, "data.txt"), []byte("tenant "+second.AllocID), 0o644))
	a.end(second)
	third := tenant(3, 0)
	a.hold("scratch-0", third)
	res, err = e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, got.Dataset, res[0].Dataset)
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	must.Eq(t, "tenant "+second.AllocID, readData(t, res[0]))
	must.Eq(t, third.AllocID, recordedOwner(t, e, res[0].Dataset).AllocID)
	must.Eq(t, second.AllocID+","+first.AllocID, e.pool.Prop(t, res[0].Dataset, record.PropDataFrom), must.Sprint("the lineage gains the owner it leaves"))
	a.start(third)

	// Another identity on the same slot: the dataset is archived, and the
	// newcomer (no archive of its own) starts empty.
	a.end(third)
	other := tenant(4, 1)
	a.hold("scratch-0", other)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err = e.mgr.Reserve(rctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, "", readData(t, res[0]))
	must.NotEq(t, guid, e.guid(t, res[0].Dataset))
	must.NoError(t, e.mgr.Wait(ctx))
	arch := archived(t, e)
	must.SliceLen(t, 1, arch)
	must.Eq(t, third.AllocID, recordedOwner(t, e, arch[0]).AllocID)
}

// TestRestore_Faults: when the restore cannot be done, restore =
// "required" fails the Reserve (at reserve_timeout) with the reason and
// leaves the slot free, while "best-effort" starts the task empty and says
// why; the archive keeps the data either way.
func TestRestore_Faults(t *testing.T) {
	cases := []struct {
		mode, fault string
		wantErr     string // required
		wantHealth  string // best-effort
	}{
		{slots.RestoreRequired, "incomplete view", `class "scratch" has restore = "required" and the asker cannot be identified`, ""},
		{slots.RestoreBestEffort, "incomplete view", "", "owner unknown"},
		{slots.RestoreRequired, "rename fails", `class "scratch" has restore = "required" and restoring`, ""},
		{slots.RestoreBestEffort, "rename fails", "", "started empty: restoring"},
		{slots.RestoreRequired, "no index in the allocation's name", "cannot be read from its name", ""},
		{slots.RestoreRequired, "names too long to tell apart", "are too long (256 bytes or more)", ""},
		{slots.RestoreBestEffort, "no index in the allocation's name", "", "started empty: the index of"},
	}
	for _, tc := range cases {
		t.Run(tc.mode+"/"+tc.fault, func(t *testing.T) {
			w := zfstest.NewWrapper(t)
			w.SetPATH(t)
			e, a := newRestoreEnv(t, 1, tc.mode)
			ctx := context.Background()
			first := tenant(1, 0)
			reserveAndWrite(t, e, a, "scratch-0", first)
			a.end(first)
			must.NoError(t, e.mgr.ReleaseEnded(ctx))
			must.NoError(t, e.mgr.Wait(ctx))
			arch := archived(t, e)
			must.SliceLen(t, 1, arch)

			second := tenant(2, 0)
			switch tc.fault {
			case "no index in the allocation's name": // its identity cannot be known
				second.AllocName = "job.grp"
			case "names too long to tell apart": // recorded cut, it could be another's
				second.Task = strings.Repeat("t", 300)
			case "incomplete view": // who asks cannot be known
				a.mu.Lock()
				a.incomplete = "the token cannot list namespaces"
				a.mu.Unlock()
			case "rename fails":
				w.Fail("rename", "cannot rename: made to fail by the test")
			}
			a.hold("scratch-0", second)
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			res, err := e.mgr.Reserve(rctx, []string{"scratch-0"})
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				must.ErrorContains(t, err, "reserve_timeout")
				must.Eq(t, "free", stateOf(t, e, slotByID(t, e, "scratch-0").Dataset))
			} else {
				must.NoError(t, err)
				must.Eq(t, "", readData(t, res[0]))
				must.StrContains(t, slotByID(t, e, "scratch-0").HealthDesc, tc.wantHealth)
			}
			w.Unfail("rename")
			must.Eq(t, arch, archived(t, e))
			must.Eq(t, first.AllocID, recordedOwner(t, e, arch[0]).AllocID)
		})
	}
}

// TestRestore_WaitsForAPredecessorStillInAnotherSlot: the replacement is
// placed on another slot while its predecessor's dataset is still in the
// first (ended, not yet archived). A required restore waits for it rather
// than start empty, and gets it once it is archived.
func TestRestore_WaitsForAPredecessorStillInAnotherSlot(t *testing.T) {
	e, a := newRestoreEnv(t, 2, slots.RestoreRequired)
	ctx := context.Background()
	first := tenant(1, 0)
	reserveAndWrite(t, e, a, "scratch-0", first)
	a.end(first)

	second := tenant(2, 0)
	a.hold("scratch-1", second)
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := e.mgr.Reserve(rctx, []string{"scratch-1"})
	must.ErrorContains(t, err, "the data of its predecessor is still in device scratch-0, not yet archived")

	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	res, err := e.mgr.Reserve(ctx, []string{"scratch-1"})
	must.NoError(t, err)
	must.Eq(t, "tenant "+first.AllocID, readData(t, res[0]))
}

// TestRestore_WaitsForTheReleaseUnderWay (red team): another identity's
// tenant ends on the slot, and its release puts the spare in service at
// once while its old dataset is still on its way to the archive. The
// allocation placed on the freed device next has an archive of its own,
// and its Reserve comes inside that release. The slot's other name is
// still taken, so the archive cannot come in yet:
//   - the release goes on (its `zfs rename` paused by a wrapper first on
//     PATH, then let go): the Reserve waits for it, then gets its data.
//     Before, with restore = "best-effort", it started empty, and its
//     empty dataset would have been archived as its newest;
//   - the release keeps failing (the rename refused): a best-effort
//     Reserve waits 10 s at most, then starts empty and says why, rather
//     than wait for another tenant's release until reserve_timeout; the
//     archive is kept.
func TestRestore_WaitsForTheReleaseUnderWay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fault   func(w *zfstest.Wrapper, ds string)
		restore bool // the Reserve gets the archive; else it starts empty
	}{
		{"the release goes on", func(w *zfstest.Wrapper, ds string) { w.PauseFor("rename", ds) }, true},
		{"the release keeps failing", func(w *zfstest.Wrapper, ds string) {
			w.FailFor("rename", ds, "cannot rename '"+ds+"': out of space")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, e, a := newWrappedRestoreEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			first := tenant(1, 0)
			guid := archivedTenant(t, e, a, "scratch-0", first)

			other := tenant(2, 1)
			q := reserveAndWrite(t, e, a, "scratch-0", other)
			a.end(other)
			tc.fault(w, q.Dataset)
			t.Cleanup(func() { w.Resume("rename"); w.Unfail("rename") })
			released := make(chan error, 1)
			go func() { released <- e.mgr.ReleaseEnded(ctx) }()
			if tc.restore {
				w.WaitPaused(t, "rename", 30*time.Second)
			} else {
				<-released // the rename refused: the release failed
			}

			second := tenant(3, 0)
			a.hold("scratch-0", second)
			began := time.Now()
			done := goReserve(ctx, e, "scratch-0")
			if !tc.restore {
				got := <-done
				must.NoError(t, got.err)
				took := time.Since(began)
				must.Greater(t, 9*time.Second, took, must.Sprint("it waited for the release first"))
				must.Less(t, 30*time.Second, took, must.Sprint("but not until reserve_timeout"))
				must.Eq(t, "", readData(t, got.res[0]))
				must.SliceContains(t, archivedGUIDs(t, e), guid, must.Sprint("the archive is kept"))
				// The failing release is the slot's health meanwhile; once
				// it is over, the health says why the tenant started empty.
				must.StrContains(t, slotByID(t, e, "scratch-0").HealthDesc, "out of space")
				w.Unfail("rename")
				must.NoError(t, e.mgr.ReleaseEnded(ctx))
				must.NoError(t, e.mgr.Wait(ctx))
				must.StrContains(t, slotByID(t, e, "scratch-0").HealthDesc, "started empty: restoring")
				return
			}
			early := false
			var got reserveResult
			select {
			case got = <-done:
				early = true
			case <-time.After(time.Second):
			}
			w.Resume("rename")
			if !early {
				got = <-done
			}
			must.NoError(t, <-released)
			must.NoError(t, got.err)
			must.False(t, early, must.Sprint("the Reserve did not wait for the release under way"))
			must.Eq(t, "tenant "+first.AllocID, readData(t, got.res[0]))
			must.Eq(t, guid, e.guid(t, got.res[0].Dataset))
			must.Eq(t, "", slotByID(t, e, "scratch-0").HealthDesc)
		})
	}
}

// TestRestore_WaitsForItsPredecessor (review): the replacement of an
// allocation that has ended asks while its predecessor's data is not in
// the archive yet, but on its way there or about to be:
//   - on its way: the release pass saw the end first, and the dataset's
//     `zfs rename` into the archive is under way (paused by a wrapper
//     first on PATH);
//   - about to be: no pass has seen the end yet, so the predecessor's slot
//     is still recorded in use, and the replacement asks for another
//     device; the read made for its Reserve shows the predecessor ended.
//
// With restore = "best-effort" the Reserve waits for the data, then gets
// it; before, it started empty.
func TestRestore_WaitsForItsPredecessor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		slots  int
		device string // the replacement's
		paused bool   // the release runs first, its rename paused
	}{
		{"on its way", 1, "scratch-0", true},
		{"about to be", 2, "scratch-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := zfstest.NewWrapper(t)
			w.SetPATH(t)
			e, a := newRestoreEnv(t, tc.slots, slots.RestoreBestEffort)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			first := tenant(1, 0)
			s := reserveAndWrite(t, e, a, "scratch-0", first)
			guid := e.guid(t, s.Dataset)
			a.end(first)
			released := make(chan error, 1)
			if tc.paused {
				w.PauseFor("rename", s.Dataset)
				t.Cleanup(func() { w.Resume("rename") })
				go func() { released <- e.mgr.ReleaseEnded(ctx) }()
				w.WaitPaused(t, "rename", 30*time.Second)
			}

			second := tenant(2, 0)
			a.hold(tc.device, second)
			done := make(chan error, 1)
			var res []slots.Slot
			go func() {
				var err error
				res, err = e.mgr.Reserve(ctx, []string{tc.device})
				done <- err
			}()
			select {
			case err := <-done:
				t.Fatalf("the Reserve did not wait for its predecessor's data (error %v)", err)
			case <-time.After(time.Second):
			}
			if tc.paused {
				w.Resume("rename")
			} else {
				go func() { released <- e.mgr.ReleaseEnded(ctx) }() // the pass its Reserve kicked
			}
			must.NoError(t, <-done)
			must.NoError(t, <-released)
			must.Eq(t, "tenant "+first.AllocID, readData(t, res[0]))
			must.Eq(t, guid, e.guid(t, res[0].Dataset))
		})
	}
}

// TestRestore_SeveralDevicesKeepTheirPaths (red team): Nomad gives a
// task's device IDs in an order that comes from a map, so it differs
// between allocations of the same job. The task sees its datasets at
// <path>/0, <path>/1 in the order Reserve returns them, and a restore
// gives the archives in the order of the slots they came from. Before,
// Reserve returned the slots in Nomad's order: data written at /0 of a
// slot with the higher index came back at /1. Reserve now returns them in
// the order of their index, whatever order they were asked in.
func TestRestore_SeveralDevicesKeepTheirPaths(t *testing.T) {
	for _, tc := range []struct {
		name         string
		first, again []string // the order Nomad gives the IDs
	}{
		{"asked backwards, then forwards", []string{"scratch-1", "scratch-0"}, []string{"scratch-0", "scratch-1"}},
		{"asked forwards, then backwards", []string{"scratch-0", "scratch-1"}, []string{"scratch-1", "scratch-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, a := newRestoreEnv(t, 2, slots.RestoreRequired)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			first := tenant(1, 0)
			for _, id := range tc.first {
				a.hold(id, first)
			}
			res, err := e.mgr.Reserve(ctx, tc.first)
			must.NoError(t, err)
			must.SliceLen(t, 2, res)
			a.start(first)
			for i, s := range res {
				must.NoError(t, os.WriteFile(filepath.Join(s.Mountpoint, "data.txt"), []byte("at /"+itoa(i)), 0o644))
			}
			must.NoError(t, e.mgr.Wait(ctx))
			a.end(first)
			must.NoError(t, e.mgr.ReleaseEnded(ctx))
			must.NoError(t, e.mgr.Wait(ctx))
			must.SliceLen(t, 2, archived(t, e))

			second := tenant(2, 0)
			for _, id := range tc.again {
				a.hold(id, second)
			}
			res, err = e.mgr.Reserve(ctx, tc.again)
			must.NoError(t, err)
			must.SliceLen(t, 2, res)
			for i, s := range res {
				must.Eq(t, "at /"+itoa(i), readData(t, s), must.Sprintf("the dataset returned at /%d (device %s)", i, s.ID))
			}
			must.SliceEmpty(t, archived(t, e))
		})
	}
}

// forkedArchives answers every Claim as backup_dir's restore does for an
// identity whose data forked (archiveSource wraps the keeper's
// *DivergedError, which is record.ErrDiverged): the one answer of the
// real pruner and keeper that these tests, which have no backup_dir, make
// by hand.
type forkedArchives struct{}

func (forkedArchives) Claim(context.Context, string, record.Owner, record.Awaited) ([]string, record.Lineage, func(), error) {
	return nil, nil, func() {}, fmt.Errorf("fetching from backup_dir: the data of the identity forked: %w", record.ErrDiverged)
}

// TestRestore_AForkWaitsWhateverTheSetting: when the identity's data
// forked, the Reserve waits (and fails at its timeout, naming why) with
// restore = "best-effort" as with "required": an empty start would begin
// a third line of data that hides the fork. The slot stays free.
func TestRestore_AForkWaitsWhateverTheSetting(t *testing.T) {
	for _, mode := range []string{slots.RestoreRequired, slots.RestoreBestEffort} {
		t.Run(mode, func(t *testing.T) {
			e, a := newRestoreEnv(t, 1, mode)
			e.mgr.SetArchives(forkedArchives{})
			asker := tenant(1, 0)
			a.hold("scratch-0", asker)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
			must.ErrorContains(t, err, "its task does not start without it")
			must.ErrorContains(t, err, "forked")
			must.Eq(t, "free", stateOf(t, e, slotByID(t, e, "scratch-0").Dataset))
		})
	}
}
