package slots

// Whether a slot that a tenant may have written can be handed over,
// released or must be kept: the one judgment that Reserve and the release
// pass share, made from a read of the node's allocations.

import (
	"context"
	"fmt"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
)

// decisionKind is what may be done with an in-use slot.
type decisionKind int

const (
	keep         decisionKind = iota // keep the data; reason says why
	handOver                         // the asker is the recorded owner
	startRelease                     // the owner has ended: release, then hand over fresh
	inUse                            // the owner is live and alone: nothing to do
	adopt                            // an earlier run's armed dataset that nobody had: adoptArmed
)

type decision struct {
	kind   decisionKind
	reason string
	// conflict: something holds the device that should not.
	conflict bool
	// asker, for a startRelease decided for Reserve, is the one other
	// live holder of the device (the allocation asking), when the view
	// shows it: the fresh dataset is made for it.
	asker record.Owner
	// live, for inUse: the owner has not ended, and nobody else holds
	// the device.
	live bool
}

// decide says what may be done with reserved slot s, from view v (a read
// that began after the question was asked). asking is true for Reserve
// (the asker is among the live holders and has not started) and false for
// the background release pass. It makes a Nomad call only to ask whether
// an owner absent from the view is gone. It never guesses: anything it
// cannot prove is "keep".
func (m *Manager) decide(ctx context.Context, n Nomad, v *View, s Slot, asking bool) decision {
	holders := v.Holders(s.ID)
	if !v.Complete {
		// Allocations of namespaces the token cannot read are left out of
		// the view: the sole visible holder is not the sole holder, and no
		// visible holder is not none. Nothing is proven either way.
		if !s.Owner.Known() {
			return decision{reason: "owner unknown: the allocation it was handed to was never identified, and the token may not see every namespace (see the warning); its data is kept"}
		}
		return decision{reason: fmt.Sprintf("owner unverified: it holds the data of %s, and the token may not see every namespace (see the warning), so who else holds the device cannot be known; its data is kept", s.Owner)}
	}
	if !s.Owner.Known() {
		if m.mayAdopt(v, s, holders, asking) {
			return decision{kind: adopt, reason: "armed by an earlier run of the plugin, and no allocation has had it"}
		}
		if !asking && len(holders) == 0 && v.Complete {
			return decision{kind: startRelease, reason: "no allocation holds it and the token sees every namespace"}
		}
		return decision{reason: "owner unknown: the allocation it was handed to was never identified; its data is kept until no allocation holds it"}
	}
	var others []Holding
	ownerHolds := false
	for _, h := range holders {
		if h.Owner.AllocID == s.Owner.AllocID {
			ownerHolds = true
		} else {
			others = append(others, h)
		}
	}
	if asking && ownerHolds && len(others) == 0 {
		return decision{kind: handOver}
	}
	f, err := allocs.FateOf(ctx, n, v, s.Owner)
	switch {
	case err != nil:
		return decision{reason: fmt.Sprintf("owner unverified: it holds the data of %s, whose state cannot be read (%v)", s.Owner, err)}
	case !f.Ended && len(others) > 0:
		return decision{reason: fmt.Sprintf("still in use by %s, which is %s; %s waits for it to end", s.Owner, stoppingOr(f), describe(others))}
	case !f.Ended:
		return decision{kind: inUse, reason: f.Reason, live: true}
	}
	for _, h := range others {
		if h.Started {
			m.log.Error("conflict: a running allocation holds a device whose dataset belongs to an ended allocation; keeping the data", "device", s.ID, "owner", s.Owner.String(), "holder", h.Owner.String())
			return decision{conflict: true, reason: fmt.Sprintf("conflict: %s has ended but %s, which has started, holds the device; its data is kept", s.Owner, h.Owner)}
		}
	}
	if !asking && len(others) > 0 {
		// Whether a task has started is the servers' view, which lags the
		// client's: it is no proof that the holder never had the dataset.
		// Its own Reserve releases the dataset, proving who asks.
		return decision{kind: inUse, reason: fmt.Sprintf("%s has ended; %s holds the device and its Reserve releases the dataset", s.Owner, describe(others))}
	}
	if asking && len(others) > 1 {
		return decision{conflict: true, reason: fmt.Sprintf("conflict: %d live allocations hold the device: %s", len(others), describe(others))}
	}
	d := decision{kind: startRelease, reason: f.Reason}
	if asking && len(others) == 1 {
		d.asker = others[0].Owner
	}
	return d
}

func stoppingOr(f allocs.Fate) string {
	if f.Stopping {
		return "stopping (" + f.Reason + ")"
	}
	return "live (" + f.Reason + ")"
}

func describe(hs []Holding) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.Owner.String())
	}
	return strings.Join(parts, ", ")
}
