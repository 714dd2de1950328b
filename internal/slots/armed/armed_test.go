package armed

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// armedDS is a slot dataset as `zfs get` shows it: managed, in stored
// state state, with an owner recorded when owner is set.
func armedDS(name, state string, owner bool) zfs.Dataset {
	props := map[string]zfs.Prop{
		record.PropManaged: {Value: record.ManagedSlot, Source: "local"},
		record.PropState:   {Value: state, Source: "local"},
		record.PropOwner:   {Value: "-", Source: "-"},
	}
	if owner {
		props[record.PropOwner] = zfs.Prop{Value: owner1.Encode(), Source: "local"}
	}
	return zfs.Dataset{Name: name, Props: props}
}

var owner1 = record.Owner{AllocID: "00000001-0000-0000-0000-000000000000", Namespace: "default", Job: "j", Group: "g", Task: "t", AllocName: "j.g[0]"}

// TestTracker_Normalize: what an armed state means to the run reading it.
func TestTracker_Normalize(t *testing.T) {
	const slot, alt = "tank/nomad/scratch/0", "tank/nomad/scratch/0.alt"
	cases := []struct {
		name string
		// setup prepares the run: a is this run, other an earlier one.
		setup func(a, other *Tracker) []zfs.Dataset
		// want is the state each dataset is read in, by name.
		want map[string]record.State
		// handed is how many handovers the run still waits to see recorded.
		handed int
	}{
		{
			name: "this run's, not handed over: free",
			setup: func(a, _ *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(a.Token()), false)}
			},
			want: map[string]record.State{slot: record.StateFree},
		},
		{
			name: "this run's, handed over, nothing recorded: reserved",
			setup: func(a, _ *Tracker) []zfs.Dataset {
				tok := a.Token()
				a.HandOver(tok, slot)
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(tok), false)}
			},
			want: map[string]record.State{slot: record.StateReserved}, handed: 1,
		},
		{
			name: "handed over and the owner recorded: reserved, and the handover forgotten",
			setup: func(a, _ *Tracker) []zfs.Dataset {
				tok := a.Token()
				a.HandOver(tok, slot)
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(tok), true)}
			},
			want: map[string]record.State{slot: record.StateReserved},
		},
		{
			name: "an earlier run's, no owner: reserved (it may have handed it over)",
			setup: func(_, other *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(other.Token()), false)}
			},
			want: map[string]record.State{slot: record.StateReserved},
		},
		{
			name: "an earlier run's, with an owner: reserved",
			setup: func(_, other *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(other.Token()), true)}
			},
			want: map[string]record.State{slot: record.StateReserved},
		},
		{
			name: "an earlier run's, adopted: free",
			setup: func(a, other *Tracker) []zfs.Dataset {
				tok := other.Token()
				a.Adopt(tok)
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(tok), false)}
			},
			want: map[string]record.State{slot: record.StateFree},
		},
		{
			name: "an earlier run's beside a dataset in use: reserved all the same (pair.roles withholds it)",
			setup: func(_, other *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, string(record.StateReserved), true), armedDS(alt, record.ArmedValue(other.Token()), false)}
			},
			want: map[string]record.State{slot: record.StateReserved, alt: record.StateReserved},
		},
		{
			name: "an earlier run's beside one on its way out: it may have been handed over",
			setup: func(_, other *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, string(record.StateArchived), true), armedDS(alt, record.ArmedValue(other.Token()), false)}
			},
			want: map[string]record.State{slot: record.StateArchived, alt: record.StateReserved},
		},
		{
			name: "two of an earlier run's, no owner: neither is proven",
			setup: func(_, other *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, record.ArmedValue(other.Token()), false), armedDS(alt, record.ArmedValue(other.Token()), false)}
			},
			want: map[string]record.State{slot: record.StateReserved, alt: record.StateReserved},
		},
		{
			name: "a state of an earlier version: unchanged",
			setup: func(_, _ *Tracker) []zfs.Dataset {
				return []zfs.Dataset{armedDS(slot, string(record.StateFree), false), armedDS(alt, string(record.StateReserved), false)}
			},
			want: map[string]record.State{slot: record.StateFree, alt: record.StateReserved},
		},
		{
			name: "a handover whose dataset a later read shows gone: forgotten",
			setup: func(a, _ *Tracker) []zfs.Dataset {
				a.HandOver(a.Token(), slot)
				return []zfs.Dataset{armedDS(alt, string(record.StateReserved), true)}
			},
			want: map[string]record.State{alt: record.StateReserved}, handed: 0,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, other := New(), New()
			ds := tc.setup(a, other)
			got := a.Normalize(ds, time.Now().Add(time.Second), "tank/nomad", 2, true)
			must.Eq(t, len(ds), len(got))
			for _, d := range got {
				v, _ := d.Local(record.PropState)
				must.EqOp(t, tc.want[d.Name], record.State(v), must.Sprintf("%s", d.Name))
			}
			for i, d := range ds {
				stored, _ := d.Local(record.PropState)
				tok, armed := record.ArmedToken(stored)
				if HasOwner(d) {
					tok, armed = "", false // its handover is recorded
				}
				shown, has := got[i].Local(PropArmed)
				must.EqOp(t, armed, has, must.Sprintf("%s: PropArmed added exactly to armed datasets with no owner", d.Name))
				must.EqOp(t, tok, shown)
				_, earlier := got[i].Local(PropEarlier)
				must.EqOp(t, armed && !a.Ours(tok), earlier, must.Sprintf("%s: PropEarlier added exactly to an earlier run's armed datasets with no owner, not adopted", d.Name))
				must.EqOp(t, stored, ds[i].Props[record.PropState].Value, must.Sprint("the read itself is not changed"))
			}
			must.EqOp(t, tc.handed, a.Outstanding())
		})
	}

	t.Run("an outside observer reads every armed dataset with no owner as free", func(t *testing.T) {
		other := New()
		ds := []zfs.Dataset{armedDS(slot, record.ArmedValue(other.Token()), false), armedDS(alt, record.ArmedValue(other.Token()), true)}
		got := (*Tracker)(nil).Normalize(ds, time.Time{}, "tank/nomad", 2, true)
		v0, _ := got[0].Local(record.PropState)
		v1, _ := got[1].Local(record.PropState)
		must.EqOp(t, record.StateFree, record.State(v0))
		must.EqOp(t, record.StateReserved, record.State(v1))
	})

	t.Run("a read begun before a handover does not forget it", func(t *testing.T) {
		a := New()
		before := time.Now()
		a.HandOver(a.Token(), slot)
		a.Normalize(nil, before.Add(-time.Second), "tank/nomad", 2, true)
		must.EqOp(t, 1, a.Outstanding())
		a.Normalize(nil, time.Now().Add(time.Second), "tank/nomad/other", 2, true)
		must.EqOp(t, 1, a.Outstanding(), must.Sprint("a read of another tree says nothing of it"))
		a.Normalize(nil, time.Now().Add(time.Second), "tank/nomad", 0, true)
		must.EqOp(t, 1, a.Outstanding(), must.Sprint("a read of the name alone says nothing of its children"))
		a.Normalize(nil, time.Now().Add(time.Second), "tank/nomad", 2, false)
		must.EqOp(t, 1, a.Outstanding(), must.Sprint("a read that failed says nothing of it (review: it used to forget every handover)"))
		broken := armedDS(slot, "x", false)
		broken.Err = errors.New("malformed line")
		a.Normalize([]zfs.Dataset{broken}, time.Now().Add(time.Second), "tank/nomad", 2, true)
		must.EqOp(t, 1, a.Outstanding(), must.Sprint("nor does one that could not read the dataset"))
		other := armedDS(alt, "x", false)
		other.Err = errors.New("malformed line")
		a.Normalize([]zfs.Dataset{other}, time.Now().Add(time.Second), "tank/nomad", 2, true)
		must.EqOp(t, 1, a.Outstanding(), must.Sprint("nor one in which any dataset did not parse"))
		a.Normalize(nil, time.Now().Add(time.Second), "tank/nomad", 2, true)
		must.EqOp(t, 0, a.Outstanding())
	})
}

// TestTracker_Current: a slot view's token is current while it is that of
// the dataset this run last made under the name, or one this run did not
// make (an earlier run's, adopted).
func TestTracker_Current(t *testing.T) {
	a := New()
	props := slotProps()
	old, _ := record.ArmedToken(a.Arm("tank/nomad/scratch/0", props)[record.PropState])
	must.True(t, a.Current("tank/nomad/scratch/0", old))
	made, _ := record.ArmedToken(a.Arm("tank/nomad/scratch/0", props)[record.PropState])
	must.False(t, a.Current("tank/nomad/scratch/0", old), must.Sprint("made again since the view"))
	must.True(t, a.Current("tank/nomad/scratch/0", made))
	must.True(t, a.Current("tank/nomad/scratch/1", New().Token()))

	// claim is the check and the handover in one step.
	must.False(t, a.Claim("tank/nomad/scratch/0", old))
	must.EqOp(t, 0, a.Outstanding())
	must.True(t, a.Claim("tank/nomad/scratch/0", made))
	must.EqOp(t, 1, a.Outstanding())
}

// TestTracker_ArmsSlotDatasets: a slot dataset that would be created
// free is created armed with a new token of the run, remembered by name;
// anything else is created as asked.
func TestTracker_ArmsSlotDatasets(t *testing.T) {
	a := New()
	props := slotProps()
	got := a.Arm("tank/nomad/scratch/0", props)
	tok, ok := record.ArmedToken(got[record.PropState])
	must.True(t, ok, must.Sprintf("%q", got[record.PropState]))
	must.True(t, a.Ours(tok))
	must.EqOp(t, tok, a.TokenOf("tank/nomad/scratch/0"))
	must.EqOp(t, string(record.StateFree), props[record.PropState], must.Sprint("the caller's map is not changed"))
	again := a.Arm("tank/nomad/scratch/0", props)
	must.NotEq(t, got[record.PropState], again[record.PropState], must.Sprint("every dataset gets its own token"))

	other := map[string]string{record.PropManaged: record.ManagedClass}
	must.Eq(t, other, a.Arm("tank/nomad/scratch", other))
	reserved := map[string]string{record.PropManaged: record.ManagedSlot, record.PropState: string(record.StateReserved)}
	must.Eq(t, reserved, a.Arm("tank/nomad/scratch/1", reserved))

	// Made free (review): an encrypted dataset (not mounted after a
	// reboot, a later run could not adopt it), and any while the views are
	// known incomplete (none proves that nobody holds a device).
	encrypted := maps.Clone(props)
	encrypted["encryption"] = "aes-256-gcm"
	must.Eq(t, encrypted, a.Arm("tank/nomad/scratch/2", encrypted))
	a.SetIncomplete(true)
	must.Eq(t, props, a.Arm("tank/nomad/scratch/3", props))
}

// slotProps are the properties of a new slot dataset (as the manager's
// Class.SlotProps gives them): managed, free.
func slotProps() map[string]string {
	return map[string]string{"setuid": "off", "devices": "off", "refquota": "1048576",
		record.PropManaged: record.ManagedSlot, record.PropState: string(record.To(record.Create))}
}
