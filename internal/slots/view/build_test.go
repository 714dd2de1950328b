package view

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ds builds an observed dataset; props are name=value pairs set locally.
func ds(name string, props ...string) zfs.Dataset {
	d := zfs.Dataset{Name: name, Props: map[string]zfs.Prop{}}
	for i := 0; i+1 < len(props); i += 2 {
		d.Props[props[i]] = zfs.Prop{Value: props[i+1], Source: "local"}
	}
	return d
}

func slotDS(name string, state record.State) zfs.Dataset {
	return ds(name, record.PropManaged, record.ManagedSlot, record.PropState, string(state), "refquota", "1048576", "mounted", "yes", "mountpoint", "/"+name)
}

func testConfig(slots int) reconcile.Config {
	return reconcile.Config{Parent: "tank/nomad", Classes: []reconcile.Class{{Name: "scratch", Slots: slots, Quota: 1 << 20, Mode: 0o770}}}
}

func TestBuildSlots_Health(t *testing.T) {
	cfg := testConfig(4)
	observed := []zfs.Dataset{
		ds("tank/nomad"),
		ds("tank/nomad/scratch", record.PropManaged, record.ManagedClass),
		slotDS("tank/nomad/scratch/0", record.StateFree),
		ds("tank/nomad/scratch/1", record.PropManaged, record.ManagedSlot, record.PropState, "free", "mounted", "no", "mountpoint", "/x"),
		ds("tank/nomad/scratch/2"),
		slotDS("tank/nomad/scratch/6", record.StateReserved),
	}
	slots := Build(cfg, observed, "", map[string]string{"tank/nomad/scratch/3": "create slot failed: boom"})
	var ids []string
	for _, s := range slots {
		ids = append(ids, s.ID)
	}
	must.Eq(t, []string{"scratch-0", "scratch-1", "scratch-2", "scratch-3", "scratch-6"}, ids)
	must.True(t, slots[0].Healthy)
	must.Eq(t, "/tank/nomad/scratch/0", slots[0].Mountpoint)
	must.False(t, slots[1].Healthy)
	must.StrContains(t, slots[1].HealthDesc, "not mounted")
	must.StrContains(t, slots[2].HealthDesc, "not managed by nomad-device-zfs")
	must.Eq(t, "create slot failed: boom", slots[3].HealthDesc)
	must.True(t, slots[4].Surplus)
	must.StrContains(t, slots[4].HealthDesc, "beyond slots = 4")

	down := Build(cfg, nil, "pool tank is FAULTED", nil)
	must.SliceLen(t, 4, down)
	for _, s := range down {
		must.False(t, s.Healthy)
		must.Eq(t, "pool tank is FAULTED", s.HealthDesc)
	}
}

// TestBuildSlots_Pair: which of a slot's two datasets serves, which is its
// spare and which is on its way out, from the states ZFS records.
func TestBuildSlots_Pair(t *testing.T) {
	base := []zfs.Dataset{ds("tank/nomad"), ds("tank/nomad/scratch", record.PropManaged, record.ManagedClass)}
	const first, alt = "tank/nomad/scratch/0", "tank/nomad/scratch/0.alt"
	cases := []struct {
		name           string
		observed       []zfs.Dataset
		dataset, spare string
		old            string
		state          record.State
		healthy        bool
		desc           string
	}{
		{"one fresh dataset serves", []zfs.Dataset{slotDS(first, record.StateFree)}, first, "", "", record.StateFree, true, ""},
		{"in use under the alternate name, spare under the first", []zfs.Dataset{slotDS(first, record.StateFree), slotDS(alt, record.StateReserved)}, alt, first, "", record.StateReserved, true, ""},
		{"released beside its spare: the spare serves", []zfs.Dataset{slotDS(first, record.StateArchived), slotDS(alt, record.StateFree)}, alt, "", first, record.StateFree, true, ""},
		{"released beside the one in use", []zfs.Dataset{slotDS(first, record.StateReserved), slotDS(alt, record.StateDestroying)}, first, "", alt, record.StateReserved, true, ""},
		{"released, nothing beside it", []zfs.Dataset{slotDS(alt, record.StateArchived)}, alt, "", "", record.StateReleasing, false, "releasing"},
		{"both in use: a conflict, both kept", []zfs.Dataset{slotDS(first, record.StateReserved), slotDS(alt, record.StateReserved)}, first, "", "", record.StateReserved, false, "both in use"},
		{"someone else's first name: the slot is theirs", []zfs.Dataset{ds(first), slotDS(alt, record.StateFree)}, first, "", "", "", false, "not managed"},
		{"a spare that is not mounted is no spare", []zfs.Dataset{slotDS(first, record.StateReserved),
			ds(alt, record.PropManaged, record.ManagedSlot, record.PropState, "free", "mounted", "no", "mountpoint", "/x")}, first, "", "", record.StateReserved, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Build(testConfig(1), append(append([]zfs.Dataset(nil), base...), tc.observed...), "", nil)
			must.SliceLen(t, 1, got)
			s := got[0]
			must.Eq(t, tc.dataset, s.Dataset)
			must.Eq(t, tc.spare, s.Spare)
			old := ""
			if s.Old != nil {
				old = s.Old.Dataset
			}
			must.Eq(t, tc.old, old)
			must.Eq(t, tc.state, s.State)
			must.Eq(t, tc.healthy, s.Healthy, must.Sprint(s.HealthDesc))
			must.StrContains(t, s.HealthDesc, tc.desc)
		})
	}
}
