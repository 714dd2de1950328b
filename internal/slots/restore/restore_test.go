package restore

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// TestOn: only best-effort and required restore at Reserve.
func TestOn(t *testing.T) {
	for _, tc := range []struct {
		restore string
		want    bool
	}{
		{reconcile.RestoreOff, false},
		{"", false},
		{reconcile.RestoreBestEffort, true},
		{reconcile.RestoreRequired, true},
	} {
		t.Run(tc.restore, func(t *testing.T) {
			must.Eq(t, tc.want, On(reconcile.Class{Restore: tc.restore}))
		})
	}
}

// TestPredecessorSlot: the slot holding the data of another allocation of
// the asker's identity, and whether all such data is on its way to the
// archive (which only ever makes the asker wait), from the slot list and
// the read made for the Reserve. The real restores are in slots'
// restore_test.go, on a real pool.
func TestPredecessorSlot(t *testing.T) {
	const class = "scratch"
	id := func(alloc string, index int) record.Owner {
		return record.Owner{AllocID: alloc, Namespace: "default", Job: "web", Group: "g", Task: "t",
			AllocName: "web.g[" + string(rune('0'+index)) + "]"}
	}
	asker := id("a-new", 0)
	before := id("a-old", 0)
	other := id("a-other", 1) // another index: another identity
	slot := func(dev string, st record.State, o record.Owner) view.Slot {
		return view.Slot{ID: dev, Class: class, State: st, Owner: o}
	}
	withOld := func(s view.Slot, o record.Owner) view.Slot {
		s.Old = &view.Slot{ID: s.ID, Class: class, State: record.StateReleasing, Owner: o}
		return s
	}
	running := &allocs.View{Allocs: map[string]allocs.Alloc{"a-old": {Owner: before, ClientStatus: "running"}}}
	stopping := &allocs.View{Allocs: map[string]allocs.Alloc{"a-old": {Owner: before, ClientStatus: "running", Stopping: true}}}
	ended := &allocs.View{Allocs: map[string]allocs.Alloc{"a-old": {Owner: before, ClientStatus: "complete"}}}
	gone := &allocs.View{Allocs: map[string]allocs.Alloc{}}
	for _, tc := range []struct {
		name        string
		all         []view.Slot
		v           *allocs.View
		wantID      string
		wantLeaving bool
	}{
		{"none: free slots", []view.Slot{slot("scratch-0", record.StateFree, record.Owner{}), slot("scratch-1", record.StateFree, record.Owner{})}, running, "", false},
		{"another identity's data is no predecessor", []view.Slot{slot("scratch-1", record.StateReserved, other)}, running, "", false},
		{"a slot the asker reserves is not its predecessor's", []view.Slot{slot("scratch-0", record.StateReserved, before)}, running, "", false},
		{"another class's slot is not looked at", []view.Slot{{ID: "other-1", Class: "other", State: record.StateReserved, Owner: before}}, running, "", false},
		{"in use by a running predecessor", []view.Slot{slot("scratch-1", record.StateReserved, before)}, running, "scratch-1", false},
		{"in use by a stopping predecessor", []view.Slot{slot("scratch-1", record.StateReserved, before)}, stopping, "scratch-1", true},
		{"in use by an ended predecessor", []view.Slot{slot("scratch-1", record.StateReserved, before)}, ended, "scratch-1", true},
		{"in use by a predecessor gone from the list", []view.Slot{slot("scratch-1", record.StateReserved, before)}, gone, "scratch-1", true},
		{"being released", []view.Slot{slot("scratch-1", record.StateReleasing, before)}, running, "scratch-1", true},
		{"being destroyed", []view.Slot{slot("scratch-1", record.StateDestroying, before)}, running, "scratch-1", true},
		{"on its way out beside the asker's slot", []view.Slot{withOld(slot("scratch-0", record.StateFree, record.Owner{}), before)}, running, "scratch-0", true},
		{"one leaving, one running: not all leaving", []view.Slot{slot("scratch-1", record.StateReleasing, before), slot("scratch-2", record.StateReserved, id("a-older", 0))},
			&allocs.View{Allocs: map[string]allocs.Alloc{"a-older": {ClientStatus: "running"}}}, "scratch-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, leaving := predecessorSlot(tc.all, class, []string{"scratch-0"}, asker, tc.v)
			must.Eq(t, tc.wantID, got)
			must.Eq(t, tc.wantLeaving, leaving)
		})
	}
}
