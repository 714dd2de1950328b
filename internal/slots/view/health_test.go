package view

import (
	"errors"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// TestDerive: what the manager knows beyond ZFS, laid over a slot's
// health: a note says why an in-use slot is kept, an empty start why its
// tenant started empty, a refused fate why the previous dataset is kept,
// and an incomplete view warns on every slot; an owner identified but not
// recorded yet is shown.
func TestDerive(t *testing.T) {
	owner := record.Owner{AllocID: "a1", Task: "t"}
	reserved := Slot{ID: "scratch-0", State: record.StateReserved, OK: true}
	cases := []struct {
		name       string
		s          Slot
		k          Known
		healthy    bool
		desc       string
		ownerShown string
	}{
		{name: "as ZFS shows it", s: Slot{ID: "scratch-0", State: record.StateFree, OK: false, Why: "not mounted"}, desc: "not mounted"},
		{name: "a note makes an in-use slot unhealthy", s: reserved, k: Known{Notes: map[string]Note{"scratch-0": {Text: "kept", Unhealthy: true}}}, desc: "kept"},
		{name: "a note on a slot ZFS finds unsound does not hide why", s: Slot{ID: "scratch-0", State: record.StateReserved, Why: "not mounted"}, k: Known{Notes: map[string]Note{"scratch-0": {Text: "kept"}}}, desc: "not mounted"},
		{name: "an empty start says why", s: reserved, k: Known{EmptyStarts: map[string]string{"scratch-0": "no archive"}}, healthy: true, desc: "no archive"},
		{name: "an identified owner is shown", s: reserved, k: Known{Owners: map[string]record.Owner{"scratch-0": owner}}, healthy: true, ownerShown: "a1"},
		{name: "an unproven owner is shown", s: reserved, k: Known{Unproven: map[string]record.Owner{"scratch-0": owner}}, healthy: true, ownerShown: "a1"},
		{name: "a refused fate: the previous dataset kept", s: Slot{ID: "scratch-0", State: record.StateReserved, OK: true, Old: &Slot{Dataset: "pool/s/0-b", State: record.StateReserved}},
			k: Known{FateRefused: map[string]error{"pool/s/0-b": errors.New("busy")}}, healthy: true, desc: "the previous dataset pool/s/0-b is kept: release blocked: busy; its data is kept"},
		{name: "an incomplete view warns", s: reserved, k: Known{Incomplete: "namespaces"}, healthy: true, desc: "warning: namespaces"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			tc.k.Derive(&s)
			must.EqOp(t, tc.healthy, s.Healthy)
			must.EqOp(t, tc.desc, s.HealthDesc)
			must.EqOp(t, tc.ownerShown, s.Owner.AllocID)
		})
	}
}

// TestKeepSchedulable: a slot being released, and otherwise sound, is
// offered when its class has no other healthy instance, and only then.
func TestKeepSchedulable(t *testing.T) {
	releasing := func(class string) Slot {
		return Slot{Class: class, InRelease: true, Why: "being released", HealthDesc: "being released"}
	}
	cases := []struct {
		name  string
		slots []Slot
		want  []bool
	}{
		{name: "no healthy instance: offered", slots: []Slot{releasing("a")}, want: []bool{true}},
		{name: "another healthy instance: not offered", slots: []Slot{releasing("a"), {Class: "a", Healthy: true}}, want: []bool{false, true}},
		{name: "another class's healthy instance does not count", slots: []Slot{releasing("a"), {Class: "b", Healthy: true}}, want: []bool{true, true}},
		{name: "surplus: not offered", slots: []Slot{func() Slot { s := releasing("a"); s.Surplus = true; return s }()}, want: []bool{false}},
		{name: "unhealthy for another reason too: not offered", slots: []Slot{func() Slot { s := releasing("a"); s.HealthDesc = "kept"; return s }()}, want: []bool{false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			KeepSchedulable(tc.slots)
			for i, s := range tc.slots {
				must.EqOp(t, tc.want[i], s.Healthy, must.Sprintf("slot %d", i))
			}
			if tc.want[0] {
				must.StrHasPrefix(t, "fresh soon (being released)", tc.slots[0].HealthDesc)
			}
		})
	}
}
