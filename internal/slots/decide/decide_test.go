package decide

import (
	"context"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// TestDecide: the judgment from views that list every allocation they
// name (so no Nomad call is made): what is proven is handed over or
// released, anything else kept, and the asker of a release named.
func TestDecide(t *testing.T) {
	const dev = "scratch-0"
	owner := record.Owner{AllocID: "a-owner", Task: "t"}
	arm := armed.New()
	after := arm.Started().Add(time.Second)
	alloc := func(id, status string, started bool) allocs.Alloc {
		return allocs.Alloc{
			Owner: record.Owner{AllocID: id}, ClientStatus: status,
			Devices: map[string]string{dev: "t"},
			Dead:    map[string]bool{"t": status == "complete"},
			Started: map[string]bool{"t": started},
		}
	}
	viewOf := func(complete bool, as ...allocs.Alloc) *allocs.View {
		v := &allocs.View{Began: after, Allocs: map[string]allocs.Alloc{}, Complete: complete}
		for _, a := range as {
			v.Allocs[a.Owner.AllocID] = a
		}
		return v
	}
	reserved := view.Slot{ID: dev, State: record.StateReserved, Owner: owner}
	unknown := view.Slot{ID: dev, State: record.StateReserved}
	earlierArmed := view.Slot{ID: dev, State: record.StateReserved, Armed: "earlier-run-token"}
	cases := []struct {
		name     string
		v        *allocs.View
		s        view.Slot
		asking   bool
		kind     Kind
		conflict bool
		asker    string // the AllocID of the decision's asker
		live     bool
	}{
		{name: "incomplete view: kept", v: viewOf(false, alloc("a-owner", "complete", true)), s: reserved, kind: Keep},
		{name: "incomplete view, owner unknown: kept", v: viewOf(false), s: unknown, kind: Keep},
		{name: "asker is the owner, alone: handed over", v: viewOf(true, alloc("a-owner", "running", false)), s: reserved, asking: true, kind: HandOver},
		{name: "owner live and alone: in use", v: viewOf(true, alloc("a-owner", "running", true)), s: reserved, kind: InUse, live: true},
		{name: "owner live, another holds the device: kept", v: viewOf(true, alloc("a-owner", "running", true), alloc("b-next", "pending", false)), s: reserved, asking: true, kind: Keep},
		{name: "owner ended, the asker alone: released for it", v: viewOf(true, alloc("a-owner", "complete", true), alloc("b-next", "pending", false)), s: reserved, asking: true, kind: StartRelease, asker: "b-next"},
		{name: "owner ended, a started holder: conflict", v: viewOf(true, alloc("a-owner", "complete", true), alloc("b-next", "running", true)), s: reserved, asking: true, kind: Keep, conflict: true},
		{name: "owner ended, two live holders asking: conflict", v: viewOf(true, alloc("a-owner", "complete", true), alloc("b-next", "pending", false), alloc("c-other", "pending", false)), s: reserved, asking: true, kind: Keep, conflict: true},
		{name: "owner ended, a holder, release pass: its Reserve releases", v: viewOf(true, alloc("a-owner", "complete", true), alloc("b-next", "pending", false)), s: reserved, kind: InUse},
		{name: "owner ended, nobody holds: released", v: viewOf(true, alloc("a-owner", "complete", true)), s: reserved, kind: StartRelease},
		{name: "owner unknown, nobody holds, release pass: released", v: viewOf(true), s: unknown, kind: StartRelease},
		{name: "owner unknown, a holder: kept", v: viewOf(true, alloc("b-next", "running", true)), s: unknown, kind: Keep},
		{name: "an earlier run's armed dataset nobody had: adopted", v: viewOf(true), s: earlierArmed, kind: Adopt},
		{name: "an earlier run's armed dataset, the asker not started: adopted", v: viewOf(true, alloc("b-next", "pending", false)), s: earlierArmed, asking: true, kind: Adopt},
		{name: "an earlier run's armed dataset, a started holder: kept", v: viewOf(true, alloc("b-next", "running", true)), s: earlierArmed, asking: true, kind: Keep},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(context.Background(), hclog.NewNullLogger(), arm, nil, tc.v, tc.s, tc.asking)
			must.EqOp(t, tc.kind, d.Kind, must.Sprintf("reason: %s", d.Reason))
			must.EqOp(t, tc.conflict, d.Conflict)
			must.EqOp(t, tc.asker, d.Asker.AllocID)
			must.EqOp(t, tc.live, d.Live)
			if d.Kind == Keep {
				must.NotEq(t, "", d.Reason, must.Sprint("a kept slot says why"))
			}
		})
	}
}

// TestMayAdoptWithheld: a withheld spare may be adopted (its root still to
// be checked) only from a complete view begun after this run started, and
// only when the owner beside it is live and alone, or ended with nobody
// but a Reserve's asker, not started, holding the device.
func TestMayAdoptWithheld(t *testing.T) {
	owner := record.Owner{AllocID: "a-owner", Task: "t"}
	arm := armed.New()
	after, before := arm.Started().Add(time.Second), arm.Started().Add(-time.Second)
	withheld := &view.Slot{Dataset: "pool/scratch/0.alt"}
	holding := func(ids ...string) *allocs.View {
		v := &allocs.View{Began: after, Complete: true, Allocs: map[string]allocs.Alloc{}}
		for _, id := range ids {
			v.Allocs[id] = allocs.Alloc{Owner: record.Owner{AllocID: id}, ClientStatus: "pending", Devices: map[string]string{"scratch-0": "t"}}
		}
		return v
	}
	stamped := view.Slot{ID: "scratch-0", Owner: owner, Stamped: owner, Withheld: withheld}
	cases := []struct {
		name     string
		v        *allocs.View
		s        view.Slot
		d        Decision
		asking   bool
		ok, live bool
	}{
		{name: "nothing withheld", v: holding(), s: view.Slot{ID: "scratch-0", Owner: owner, Stamped: owner}, d: Decision{Kind: InUse, Live: true}},
		{name: "owner live and alone", v: holding(), s: stamped, d: Decision{Kind: InUse, Live: true}, ok: true, live: true},
		{name: "owner live, not recorded on the dataset", v: holding(), s: view.Slot{ID: "scratch-0", Owner: owner, Withheld: withheld}, d: Decision{Kind: InUse, Live: true}},
		{name: "a view begun before this run", v: func() *allocs.View { v := holding(); v.Began = before; return v }(), s: stamped, d: Decision{Kind: InUse, Live: true}},
		{name: "an incomplete view", v: func() *allocs.View { v := holding(); v.Complete = false; return v }(), s: stamped, d: Decision{Kind: InUse, Live: true}},
		{name: "owner ended, nobody holds", v: holding(), s: stamped, d: Decision{Kind: StartRelease}, ok: true},
		{name: "owner ended, the asker not started", v: holding("b-next"), s: stamped, d: Decision{Kind: StartRelease}, asking: true, ok: true},
		{name: "owner ended, a holder, release pass", v: holding("b-next"), s: stamped, d: Decision{Kind: StartRelease}},
		{name: "owner ended, two holders", v: holding("b-next", "c-other"), s: stamped, d: Decision{Kind: StartRelease}, asking: true},
		{name: "kept", v: holding(), s: stamped, d: Decision{Kind: Keep, Reason: "kept"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, live := MayAdoptWithheld(arm, tc.v, tc.s, tc.d, tc.asking)
			must.EqOp(t, tc.ok, ok)
			must.EqOp(t, tc.live, live)
		})
	}
}
