package slots_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

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
	e.pool.ZFS(t, "set", record.PropOwner+"="+next.Encode(), s.Dataset)
	e.pool.ZFS(t, "set", record.PropState+"=reserved", s.Dataset)
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
		setup   func(a *allocs, o, next record.Owner)
		wantErr string
		// wantHealth is in the slot's health after a release pass.
		wantHealth string
	}{{
		name: "API unreachable",
		setup: func(a *allocs, o, next record.Owner) {
			a.end(o)
			a.setErr(errors.New("dial tcp 127.0.0.1:4646: connection refused"))
		},
		wantErr:    "cannot be read to verify the asker (dial tcp 127.0.0.1:4646: connection refused)",
		wantHealth: "owner unverified: the node's allocations cannot be read",
	}, {
		name: "owner in a namespace the token cannot read",
		setup: func(a *allocs, o, next record.Owner) {
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
		setup: func(a *allocs, o, next record.Owner) {
			a.collect(o)
			a.mu.Lock()
			a.goneErr = errors.New("permission denied by the Nomad API: 403")
			a.mu.Unlock()
		},
		wantErr:    "whose state cannot be read (permission denied by the Nomad API: 403)",
		wantHealth: "owner unverified",
	}, {
		name:       "owner still running",
		setup:      func(a *allocs, o, next record.Owner) {},
		wantErr:    "still in use by allocation 00000020",
		wantHealth: "still in use by allocation 00000020",
	}, {
		name: "two live holders besides the ended owner",
		setup: func(a *allocs, o, next record.Owner) {
			a.end(o)
			a.hold("scratch-0", owner(99))
		},
		wantErr:    "conflict: 2 live allocations hold the device",
		wantHealth: "", // the background pass may release: neither has started
	}, {
		name: "ended owner, but another holder has started",
		setup: func(a *allocs, o, next record.Owner) {
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
