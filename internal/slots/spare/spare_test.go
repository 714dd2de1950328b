package spare

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestPromote: the spare serves, in the state given, with no owner; the
// dataset that served is the slot's old one, without a spare of its own,
// in the state its release began with.
func TestPromote(t *testing.T) {
	owner := record.Owner{AllocID: "a1", Task: "t"}
	cases := []struct {
		name  string
		state record.State
	}{
		{name: "handed over", state: record.StateReserved},
		{name: "fresh, after a release began", state: record.StateFree},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := view.Slot{
				ID: "web-0", Class: "web", Dataset: "tank/nomad/web/0", Mountpoint: "/srv/web/0",
				State: record.StateReleasing, Owner: owner, Stamped: owner,
				Spare: "tank/nomad/web/0.alt", SpareMount: "/srv/web/0.alt", SpareOwn: true, SpareArmed: "tok",
				Usage: zfs.Usage{Used: 7},
			}
			x.SetHealth(false, "releasing")
			Promote(&x, tc.state)

			must.EqOp(t, "tank/nomad/web/0.alt", x.Dataset)
			must.EqOp(t, "/srv/web/0.alt", x.Mountpoint)
			must.True(t, x.OwnMount)
			must.EqOp(t, "tok", x.Armed)
			must.EqOp(t, tc.state, x.State)
			must.False(t, x.Owner.Known())
			must.False(t, x.Stamped.Known())
			must.EqOp(t, "", x.Spare)
			must.EqOp(t, reconcile.NameReleasing, x.Sib)
			must.True(t, x.Exists)
			must.EqOp(t, zfs.Usage{}, x.Usage)
			must.True(t, x.OK)

			must.NotNil(t, x.Old)
			must.EqOp(t, "tank/nomad/web/0", x.Old.Dataset)
			must.EqOp(t, record.StateReleasing, x.Old.State)
			must.EqOp(t, owner, x.Old.Owner)
			must.EqOp(t, "", x.Old.Spare)
			must.Nil(t, x.Old.Old)
		})
	}
}
