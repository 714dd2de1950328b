package reconcile

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestPair_Roles: which of a slot's two datasets serves, which is the
// spare, which is old (on its way out, or in use with its fate due behind
// an armed spare's handover) and which is withheld, from the states a read
// shows them in, as this run reads them (armed.Tracker.Normalize).
func TestPair_Roles(t *testing.T) {
	cfg := Config{Parent: "tank/nomad", Classes: []Class{{Name: "scratch", Slots: 1}}}
	names := cfg.SlotNames("scratch", 0)
	cases := []struct {
		name string
		// setup returns the two datasets (nil: absent) as stored, a the
		// reading run, other an earlier one.
		setup                     func(a, other *armed.Tracker) [2]*zfs.Dataset
		cur, spare, old, withheld int
		conflict                  bool
	}{
		{
			name: "in use beside this run's fresh: the spare",
			setup: func(a, _ *armed.Tracker) [2]*zfs.Dataset {
				return ds2(armedDS(names[0], string(record.StateReserved), true), armedDS(names[1], record.ArmedValue(a.Token()), false))
			},
			cur: 0, spare: 1, old: -1, withheld: -1,
		},
		{
			name: "this run's handover, unrecorded, beside the ended owner's: the handover serves, the fate is due",
			setup: func(a, _ *armed.Tracker) [2]*zfs.Dataset {
				tok := a.Token()
				a.HandOver(tok, names[0])
				return ds2(armedDS(names[0], record.ArmedValue(tok), false), armedDS(names[1], string(record.StateReserved), true))
			},
			cur: 0, spare: -1, old: 1, withheld: -1,
		},
		{
			name: "an earlier run's, no owner, beside one in use: withheld",
			setup: func(_, other *armed.Tracker) [2]*zfs.Dataset {
				return ds2(armedDS(names[0], string(record.StateReserved), true), armedDS(names[1], record.ArmedValue(other.Token()), false))
			},
			cur: 0, spare: -1, old: -1, withheld: 1,
		},
		{
			name: "an earlier run's, adopted, beside one in use: the spare",
			setup: func(a, other *armed.Tracker) [2]*zfs.Dataset {
				tok := other.Token()
				a.Adopt(tok)
				return ds2(armedDS(names[0], string(record.StateReserved), true), armedDS(names[1], record.ArmedValue(tok), false))
			},
			cur: 0, spare: 1, old: -1, withheld: -1,
		},
		{
			name: "an earlier run's beside one on its way out: it serves, unproven",
			setup: func(_, other *armed.Tracker) [2]*zfs.Dataset {
				return ds2(armedDS(names[0], string(record.StateArchived), true), armedDS(names[1], record.ArmedValue(other.Token()), false))
			},
			cur: 1, spare: -1, old: 0, withheld: -1,
		},
		{
			name: "two of an earlier run's: a conflict",
			setup: func(_, other *armed.Tracker) [2]*zfs.Dataset {
				return ds2(armedDS(names[0], record.ArmedValue(other.Token()), false), armedDS(names[1], record.ArmedValue(other.Token()), false))
			},
			cur: 0, spare: -1, old: -1, withheld: -1, conflict: true,
		},
		{
			name: "two handovers of this run, unrecorded: a conflict",
			setup: func(a, _ *armed.Tracker) [2]*zfs.Dataset {
				t0, t1 := a.Token(), a.Token()
				a.HandOver(t0, names[0])
				a.HandOver(t1, names[1])
				return ds2(armedDS(names[0], record.ArmedValue(t0), false), armedDS(names[1], record.ArmedValue(t1), false))
			},
			cur: 0, spare: -1, old: -1, withheld: -1, conflict: true,
		},
		{
			name: "this run's handover beside one in use with no owner recorded: a conflict",
			setup: func(a, _ *armed.Tracker) [2]*zfs.Dataset {
				tok := a.Token()
				a.HandOver(tok, names[1])
				return ds2(armedDS(names[0], string(record.StateReserved), false), armedDS(names[1], record.ArmedValue(tok), false))
			},
			cur: 0, spare: -1, old: -1, withheld: -1, conflict: true,
		},
		{
			name: "two owners recorded: a conflict",
			setup: func(_, _ *armed.Tracker) [2]*zfs.Dataset {
				return ds2(armedDS(names[0], string(record.StateReserved), true), armedDS(names[1], string(record.StateReserved), true))
			},
			cur: 0, spare: -1, old: -1, withheld: -1, conflict: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, other := armed.New(), armed.New()
			pair := tc.setup(a, other)
			var read []zfs.Dataset
			for _, d := range pair {
				if d != nil {
					read = append(read, *d)
				}
			}
			byName := map[string]zfs.Dataset{}
			for _, d := range a.Normalize(read, time.Now(), cfg.Parent, 3, false) {
				byName[d.Name] = d
			}
			p := PairOf(cfg, "scratch", 0, byName)
			cur, spare, old, withheld := p.Roles()
			must.Eq(t, [4]int{tc.cur, tc.spare, tc.old, tc.withheld}, [4]int{cur, spare, old, withheld}, must.Sprint("cur, spare, old, withheld"))
			must.EqOp(t, tc.conflict, p.Conflict() != "", must.Sprint(p.Conflict()))
		})
	}
}

func ds2(a, b zfs.Dataset) [2]*zfs.Dataset { return [2]*zfs.Dataset{&a, &b} }

// armedDS is a slot dataset as `zfs get` shows it: managed, in stored
// state state, with an owner recorded when owner is set.
func armedDS(name, state string, owner bool) zfs.Dataset {
	props := map[string]zfs.Prop{
		record.PropManaged: {Value: record.ManagedSlot, Source: "local"},
		record.PropState:   {Value: state, Source: "local"},
		record.PropOwner:   {Value: "-", Source: "-"},
	}
	if owner {
		o := record.Owner{AllocID: "00000001-0000-0000-0000-000000000000", Namespace: "default", Job: "j", Group: "g", Task: "t", AllocName: "j.g[0]"}
		props[record.PropOwner] = zfs.Prop{Value: o.Encode(), Source: "local"}
	}
	return zfs.Dataset{Name: name, Props: props}
}
