package release

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// A release decided without a read (Known) unmounts first a dataset
// whose mountpoint is its own, as one decided from a read does: the rename
// would keep that mountpoint and mount the data again in the archive.
func TestReleasingDataset_OwnMountpoint(t *testing.T) {
	cfg := reconcile.Config{Parent: "tank/nomad", Classes: []reconcile.Class{{Name: "scratch", Slots: 1, Quota: 1 << 20, Mode: 0o770}}}
	cfg.RenameUnmounts = true
	c := cfg.Classes[0]
	for _, tc := range []struct {
		name    string
		own     bool
		unmount bool
	}{
		{name: "inherited: the rename unmounts", own: false, unmount: false},
		{name: "its own: unmounted first", own: true, unmount: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := view.Slot{ID: "scratch-0", Class: "scratch", Dataset: "tank/nomad/scratch/0", Mountpoint: "/srv/by-hand",
				State: record.StateReleasing, OwnMount: tc.own}
			got := false
			for _, a := range reconcile.ReleaseSteps(cfg, c, 0, Dataset(s, true), time.Now(), true, true) {
				got = got || a.Kind == reconcile.Unmount
			}
			must.Eq(t, tc.unmount, got)
		})
	}
}

// Of finds the dataset being released: the slot's old one, or its own
// while its fate is recorded; nothing else.
func TestOf(t *testing.T) {
	old := view.Slot{ID: "scratch-0", Dataset: "tank/nomad/scratch/0", State: record.StateReleasing}
	for _, tc := range []struct {
		name string
		cur  view.Slot
		want string // "" for none
	}{
		{name: "the old dataset", cur: view.Slot{ID: "scratch-0", Dataset: "tank/nomad/scratch/0.alt", State: record.StateReserved, Old: &old}, want: old.Dataset},
		{name: "its own, archived", cur: old, want: old.Dataset},
		{name: "its own, destroying", cur: view.Slot{ID: "scratch-0", Dataset: old.Dataset, State: record.StateDestroying}, want: old.Dataset},
		{name: "its own, in use", cur: view.Slot{ID: "scratch-0", Dataset: old.Dataset, State: record.StateReserved}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Of(tc.cur, old.Dataset)
			must.Eq(t, tc.want != "", ok)
			must.Eq(t, tc.want, got.Dataset)
		})
	}
}

// A release's fate follows the class: destroyed, or archived.
func TestFate(t *testing.T) {
	must.Eq(t, record.StateDestroying, FateState(reconcile.Class{OnRelease: reconcile.OnReleaseDestroy}))
	must.Eq(t, record.ReleaseDestroy, FateEvent(reconcile.Class{OnRelease: reconcile.OnReleaseDestroy}))
	must.Eq(t, record.StateReleasing, FateState(reconcile.Class{}))
	must.Eq(t, record.Release, FateEvent(reconcile.Class{}))
}
