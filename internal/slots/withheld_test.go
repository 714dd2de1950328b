package slots_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestWithheld_ARestartBeforeTheFateBehindAHandover (issue 10): an armed
// spare is handed over in memory and the fate of the dataset it replaces
// is written behind it. A plugin stopped in between (here: the fate
// refused by a wrapper first on PATH, which leaves ZFS as a stop would)
// leaves the ended owner's dataset in use beside an armed dataset with no
// owner, which the new tenant has written. The next run must not take
// that for a spare nobody had: it withholds it, and
//   - while the new tenant runs, the slot is a conflict that keeps both
//     datasets, and a third allocation's Reserve fails;
//   - once the new tenant has ended, the next asker does not get its data
//     (the spare is not empty), and once nobody holds the device both
//     tenants' data reach the archive and the slot is fresh again.
//
// With the restart rule of before (such a dataset adopted at once as the
// spare of the dataset in use beside it), the next asker got the new
// tenant's data.
func TestWithheld_ARestartBeforeTheFateBehindAHandover(t *testing.T) {
	for _, running := range []bool{true, false} {
		t.Run(map[bool]string{true: "the new tenant runs", false: "the new tenant has ended"}[running], func(t *testing.T) {
			c := newSpareCase(t)
			w, e, a, o1, o2, s0, spare := c.w, c.e, c.a, c.o1, c.o2, c.s0, c.spare
			o3 := owner(3)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got2 := c.reserveBehindARefusedFate(t, ctx)
			a.start(o2)
			must.NoError(t, os.WriteFile(filepath.Join(got2.Mountpoint, "data.txt"), []byte("tenant "+o2.AllocID), 0o644))
			// The fate refused again: the run is stopped before it lands.
			must.ErrorIs(t, e.mgr.ReleaseEnded(ctx), zfs.ErrNoSpace)
			must.NoError(t, e.mgr.Wait(ctx))
			must.Eq(t, "reserved", stateOf(t, e, s0.Dataset))
			must.EqOp(t, "", e.pool.Prop(t, spare, record.PropOwner), must.Sprint("the new tenant's owner waits for the fate"))

			e.restart(t)
			e.mgr.SetNomad(a)
			w.Unfail("set")
			e.sync(t)
			got := slotByID(t, e, "scratch-0")
			must.Eq(t, s0.Dataset, got.Dataset)
			must.Eq(t, "", got.Spare, must.Sprint("withheld: it may have been handed over"))

			if running {
				must.NoError(t, e.mgr.ReleaseEnded(ctx))
				got = slotByID(t, e, "scratch-0")
				must.False(t, got.Healthy)
				must.StrContains(t, got.HealthDesc, "conflict")
				must.Eq(t, "", got.Spare)
				a.hold("scratch-0", o3)
				rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
				defer rcancel()
				_, err := e.mgr.Reserve(rctx, []string{"scratch-0"})
				must.ErrorContains(t, err, "scratch-0")
				must.Eq(t, "tenant "+o1.AllocID, readFile(t, s0.Mountpoint, "data.txt"))
				must.Eq(t, "tenant "+o2.AllocID, readFile(t, got2.Mountpoint, "data.txt"))
				return
			}
			a.end(o2)
			a.hold("scratch-0", o3)
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			defer rcancel()
			_, err := e.mgr.Reserve(rctx, []string{"scratch-0"})
			must.ErrorContains(t, err, "scratch-0", must.Sprint("the next asker does not get the new tenant's data"))
			must.Eq(t, "tenant "+o2.AllocID, readFile(t, got2.Mountpoint, "data.txt"))
			a.end(o3)
			must.NoError(t, e.mgr.Wait(ctx))
			// Released as any dataset whose owner was never identified, once
			// no allocation holds the device: both tenants' data archived
			// (the withheld spare's after the old dataset's, a pass later).
			want := []string{"tenant " + o1.AllocID, "tenant " + o2.AllocID}
			slices.Sort(want)
			var data []string
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
				if err := e.mgr.ReleaseEnded(ctx); err != nil {
					t.Logf("release pass: %v", err)
				}
				must.NoError(t, e.mgr.Wait(ctx))
				data = data[:0]
				for _, arch := range archived(t, e) {
					data = append(data, readArchived(t, e, arch, "data.txt"))
				}
				slices.Sort(data)
				got = slotByID(t, e, "scratch-0")
				return slices.Equal(want, data) && got.State == record.StateFree
			}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Sprint("both tenants' data archived, the slot free"))
			must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
		})
	}
}

// TestWithheld_AReplacementsOwnerIsNoProof (review): after a restart in
// the same window, with restore turned on, the ended owner's replacement
// (the same identity) gets the ended owner's dataset in place, and is
// then the live owner beside the withheld spare, which the new tenant of
// before the restart wrote. A live owner proves that a spare was never
// handed over only while it is the owner the spare was made beside: the
// spare's root must be empty all the same. Before, the pass adopted the
// written spare, and the next asker of another identity got its data.
func TestWithheld_AReplacementsOwnerIsNoProof(t *testing.T) {
	c := newSpareCase(t)
	w, e, a, o1, o2, s0 := c.w, c.e, c.a, c.o1, c.o2, c.s0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got2 := c.reserveBehindARefusedFate(t, ctx)
	a.start(o2)
	must.NoError(t, os.WriteFile(filepath.Join(got2.Mountpoint, "data.txt"), []byte("tenant "+o2.AllocID), 0o644))
	must.NoError(t, e.mgr.Wait(ctx))

	e.restart(t)
	e.cfg.Classes[0].Restore = slots.RestoreBestEffort
	e.mgr.SetConfig(e.cfg)
	e.mgr.SetNomad(a)
	w.Unfail("set")
	e.sync(t)
	a.end(o2)
	again := tenant(5, o1.AllocIndex()) // o1's replacement
	must.True(t, record.SameIdentity(o1, again))
	a.hold("scratch-0", again)
	got, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, s0.Dataset, got[0].Dataset, must.Sprint("the replacement keeps its dataset in place"))
	must.Eq(t, "tenant "+o1.AllocID, readFile(t, got[0].Mountpoint, "data.txt"))
	a.start(again)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	must.Eq(t, "", slotByID(t, e, "scratch-0").Spare, must.Sprint("still withheld: not empty"))

	a.end(again)
	other := owner(4)
	a.hold("scratch-0", other)
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	_, err = e.mgr.Reserve(rctx, []string{"scratch-0"})
	must.ErrorContains(t, err, "scratch-0", must.Sprint("the next asker does not get o2's data"))
	must.Eq(t, "tenant "+o2.AllocID, readFile(t, got2.Mountpoint, "data.txt"))
}

// TestWithheld_AFateDueOnADatasetDestroyedByHand (review): the old
// dataset whose fate ZFS refused behind the handover is destroyed by hand
// (`zfs destroy -f`). Its fate can never land, and that is no refusal:
// the next pass finds it gone, the slot serves the spare without saying
// that anything is kept, and the new tenant's owner is recorded.
func TestWithheld_AFateDueOnADatasetDestroyedByHand(t *testing.T) {
	c := newSpareCase(t)
	w, e, o2, s0, spare := c.w, c.e, c.o2, c.s0, c.spare
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.reserveBehindARefusedFate(t, ctx)
	must.ErrorIs(t, e.mgr.ReleaseEnded(ctx), zfs.ErrNoSpace)
	must.NoError(t, e.mgr.Wait(ctx))
	must.StrContains(t, slotByID(t, e, "scratch-0").HealthDesc, "release blocked")
	w.Unfail("set")
	e.pool.ZFS(t, "destroy", "-f", s0.Dataset)

	var got slots.Slot
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		if err := e.mgr.ReleaseEnded(ctx); err != nil {
			t.Logf("release pass: %v", err)
		}
		must.NoError(t, e.mgr.Wait(ctx))
		got = slotByID(t, e, "scratch-0")
		return got.Dataset == spare && !strings.Contains(got.HealthDesc, "kept") && e.pool.Prop(t, spare, record.PropOwner) != ""
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Sprint("the slot settles without the destroyed dataset"))
	must.True(t, got.Healthy, must.Sprint(got.HealthDesc))
	must.Eq(t, o2.AllocID, recordedOwner(t, e, spare).AllocID)
}

// readFile reads file in directory dir.
func readFile(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	must.NoError(t, err)
	return string(b)
}
