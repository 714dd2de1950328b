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
