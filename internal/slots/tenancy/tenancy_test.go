package tenancy

import (
	"errors"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// TestRecord: what a tenancy's end (Ended) and a restore in place
// (Restored) forget of a slot, and what they keep: only Ended counts a
// release and drops the unproven asker; neither touches another slot.
func TestRecord(t *testing.T) {
	a := record.Owner{AllocID: "a1", Task: "t"}
	cases := []struct {
		name string
		end  func(r *Record, id string)
		// releases and unproven are slot "x"'s after end.
		releases uint64
		unproven bool
	}{
		{name: "ended", end: (*Record).Ended, releases: 1},
		{name: "restored", end: (*Record).Restored, unproven: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			for _, id := range []string{"x", "y"} {
				r.SetOwner(id, a)
				r.SetUnproven(id, a)
				must.True(t, r.SetNote(id, view.Note{Text: "kept", Unhealthy: true}))
				r.SetEmptyStart(id, "no archive")
			}
			must.False(t, r.SetNote("x", view.Note{Text: "kept", Unhealthy: true})) // unchanged
			tc.end(r, "x")

			_, owned := r.Owner("x")
			must.False(t, owned)
			must.False(t, r.Noted("x"))
			must.EqOp(t, tc.releases, r.Releases("x"))
			must.EqOp(t, tc.unproven, r.Unproven("x"))
			must.MapEq(t, map[string]record.Owner{"y": a}, r.Owners())

			o, owned := r.Owner("y")
			must.True(t, owned)
			must.EqOp(t, a, o)
			must.True(t, r.Noted("y"))
			must.True(t, r.Unproven("y"))
			must.EqOp(t, 0, r.Releases("y"))
		})
	}
}

// TestDropOwner: a pending owner goes only when it is the one recorded;
// one queued meanwhile stays pending.
func TestDropOwner(t *testing.T) {
	a, b := record.Owner{AllocID: "a1", Task: "t"}, record.Owner{AllocID: "b1", Task: "t"}
	cases := []struct {
		name    string
		drop    record.Owner
		pending bool
	}{
		{name: "the one recorded", drop: a},
		{name: "another queued meanwhile", drop: b, pending: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			r.SetOwner("x", a)
			r.DropOwner("x", tc.drop)
			must.EqOp(t, tc.pending, r.Pending())
		})
	}
}

// TestFates: a refused fate is kept while it is due, and goes when it
// lands or a read shows it no longer due.
func TestFates(t *testing.T) {
	refused := errors.New("out of space")
	due := view.Slot{ID: "c-0", Dataset: "p/c/0.alt", Old: &view.Slot{ID: "c-0", Dataset: "p/c/0", State: record.StateReserved}}
	landed := view.Slot{ID: "c-0", Dataset: "p/c/0.alt", Old: &view.Slot{ID: "c-0", Dataset: "p/c/0", State: record.StateReleasing}}
	cases := []struct {
		name string
		then func(r *Record)
		want error
	}{
		{name: "still due", then: func(r *Record) { r.KeepDue([]view.Slot{due}) }, want: refused},
		{name: "landed, as a read shows", then: func(r *Record) { r.KeepDue([]view.Slot{landed}) }},
		{name: "landed, as its write says", then: func(r *Record) { r.FateLanded("p/c/0") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := New()
			r.RefuseFate("p/c/0", refused)
			must.ErrorIs(t, r.FateRefused("p/c/0"), refused)
			tc.then(r)
			if tc.want == nil {
				must.NoError(t, r.FateRefused("p/c/0"))
			} else {
				must.ErrorIs(t, r.FateRefused("p/c/0"), tc.want)
			}
		})
	}
}

// TestDerive: a reserved slot's pending owner is laid over its view, its
// note reaches its health, and the incomplete view's warning reaches
// every slot.
func TestDerive(t *testing.T) {
	a := record.Owner{AllocID: "a1", Task: "t"}
	r := New()
	r.SetOwner("c[0]", a)
	r.SetNote("c[0]", view.Note{Text: "kept: its owner may be live", Unhealthy: true})
	slots := []view.Slot{
		{ID: "c[0]", State: record.StateReserved, OK: true},
		{ID: "c[1]", State: record.StateFree, OK: true},
	}
	r.Derive(slots, "token sees one namespace")
	must.EqOp(t, a, slots[0].Owner)
	must.False(t, slots[0].Healthy)
	must.EqOp(t, "kept: its owner may be live; warning: token sees one namespace", slots[0].HealthDesc)
	must.True(t, slots[1].Healthy)
	must.EqOp(t, "warning: token sees one namespace", slots[1].HealthDesc)
}
