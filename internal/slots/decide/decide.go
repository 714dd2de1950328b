// Package decide is whether a slot that a tenant may have written can be
// handed over, released or must be kept: the one judgment that the slot
// manager's Reserve, its release pass and its preparations share, made
// from a read of the node's allocations. It changes nothing: the manager
// carries out what it decides (slots/reserve, slots/release.go).
package decide

import (
	"context"
	"fmt"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// Kind is what may be done with an in-use slot.
type Kind int

const (
	Keep         Kind = iota // keep the data; Reason says why
	HandOver                 // the asker is the recorded owner
	StartRelease             // the owner has ended: release, then hand over fresh
	InUse                    // the owner is live and alone: nothing to do
	Adopt                    // an earlier run's armed dataset that nobody had: the manager's adoptArmed
)

// Decision is what Decide says may be done with a slot, and why.
type Decision struct {
	Kind   Kind
	Reason string
	// Conflict: something holds the device that should not.
	Conflict bool
	// Asker, for a StartRelease decided for Reserve, is the one other
	// live holder of the device (the allocation asking), when the view
	// shows it: the fresh dataset is made for it.
	Asker record.Owner
	// Live, for InUse: the owner has not ended, and nobody else holds
	// the device.
	Live bool
}

// Armed is what Decide asks of the manager's armed datasets (package
// armed's Tracker): whether a token is this run's, and when this run
// started.
type Armed interface {
	Ours(token string) bool
	Started() time.Time
}

// Decide says what may be done with reserved slot s, from view v (a read
// that began after the question was asked). asking is true for Reserve
// (the asker is among the live holders and has not started) and false for
// the background release pass. It makes a Nomad call only to ask whether
// an owner absent from the view is gone. It never guesses: anything it
// cannot prove is "keep". It logs a conflict through log.
func Decide(ctx context.Context, log hclog.Logger, arm Armed, n allocs.Nomad, v *allocs.View, s view.Slot, asking bool) Decision {
	holders := v.Holders(s.ID)
	if !v.Complete {
		// Allocations of namespaces the token cannot read are left out of
		// the view: the sole visible holder is not the sole holder, and no
		// visible holder is not none. Nothing is proven either way.
		if !s.Owner.Known() {
			return Decision{Reason: "owner unknown: the allocation it was handed to was never identified, and the token may not see every namespace (see the warning); its data is kept"}
		}
		return Decision{Reason: fmt.Sprintf("owner unverified: it holds the data of %s, and the token may not see every namespace (see the warning), so who else holds the device cannot be known; its data is kept", s.Owner)}
	}
	if !s.Owner.Known() {
		if MayAdopt(arm, v, s, holders, asking) {
			return Decision{Kind: Adopt, Reason: "armed by an earlier run of the plugin, and no allocation has had it"}
		}
		if !asking && len(holders) == 0 && v.Complete {
			return Decision{Kind: StartRelease, Reason: "no allocation holds it and the token sees every namespace"}
		}
		return Decision{Reason: "owner unknown: the allocation it was handed to was never identified; its data is kept until no allocation holds it"}
	}
	var others []allocs.Holding
	ownerHolds := false
	for _, h := range holders {
		if h.Owner.AllocID == s.Owner.AllocID {
			ownerHolds = true
		} else {
			others = append(others, h)
		}
	}
	if asking && ownerHolds && len(others) == 0 {
		return Decision{Kind: HandOver}
	}
	f, err := allocs.FateOf(ctx, n, v, s.Owner)
	switch {
	case err != nil:
		return Decision{Reason: fmt.Sprintf("owner unverified: it holds the data of %s, whose state cannot be read (%v)", s.Owner, err)}
	case !f.Ended && len(others) > 0:
		return Decision{Reason: fmt.Sprintf("still in use by %s, which is %s; %s waits for it to end", s.Owner, stoppingOr(f), describe(others))}
	case !f.Ended:
		return Decision{Kind: InUse, Reason: f.Reason, Live: true}
	}
	for _, h := range others {
		if h.Started {
			log.Error("conflict: a running allocation holds a device whose dataset belongs to an ended allocation; keeping the data", "device", s.ID, "owner", s.Owner.String(), "holder", h.Owner.String())
			return Decision{Conflict: true, Reason: fmt.Sprintf("conflict: %s has ended but %s, which has started, holds the device; its data is kept", s.Owner, h.Owner)}
		}
	}
	if !asking && len(others) > 0 {
		// Whether a task has started is the servers' view, which lags the
		// client's: it is no proof that the holder never had the dataset.
		// Its own Reserve releases the dataset, proving who asks.
		return Decision{Kind: InUse, Reason: fmt.Sprintf("%s has ended; %s holds the device and its Reserve releases the dataset", s.Owner, describe(others))}
	}
	if asking && len(others) > 1 {
		return Decision{Conflict: true, Reason: fmt.Sprintf("conflict: %d live allocations hold the device: %s", len(others), describe(others))}
	}
	d := Decision{Kind: StartRelease, Reason: f.Reason}
	if asking && len(others) == 1 {
		d.Asker = others[0].Owner
	}
	return d
}

// MayAdopt reports whether view v shows of the allocations what adopting
// slot s needs (see the manager's adopt.go): s is an earlier run's armed
// dataset with no owner recorded and not cloned from a source (a clone is
// never empty), v is complete and began after this run started, and no
// allocation holds the device, or, for a Reserve (asking), only the asker,
// whose task has not started: the dataset then goes to the asker at once
// (the rounds of package reserve), so that it is never free while someone may
// be using it. A dataset of this run is never adopted: it is reserved only once handed
// over, and an allocation that the servers do not show started yet may be
// using it.
func MayAdopt(arm Armed, v *allocs.View, s view.Slot, holders []allocs.Holding, asking bool) bool {
	if s.Armed == "" || s.State != record.StateReserved || s.Owner.Known() || s.Origin != "" || arm.Ours(s.Armed) {
		return false
	}
	if !v.Complete || !v.Began.After(arm.Started()) {
		return false
	}
	return len(holders) == 0 || asking && len(holders) == 1 && !holders[0].Started
}

// MayAdoptWithheld reports whether decision d, made from view v (asking:
// for a Reserve), allows the withheld spare of slot s (as v saw it) to be
// adopted, its root still to be found empty (the manager's
// adoptWithheld): the view is complete and began after this run started,
// and either the owner recorded on the slot's dataset is live and alone
// (live), or the owner ended and nobody holds the device but, for a
// Reserve, the asker, whose task has not started.
func MayAdoptWithheld(arm Armed, v *allocs.View, s view.Slot, d Decision, asking bool) (ok, live bool) {
	if s.Withheld == nil || !v.Complete || !v.Began.After(arm.Started()) {
		return false, false
	}
	holders := v.Holders(s.ID)
	live = d.Kind == InUse && d.Live && s.Stamped.Known() && s.Stamped == s.Owner
	if !live && (d.Kind != StartRelease || len(holders) > 1 || len(holders) == 1 && (!asking || holders[0].Started)) {
		return false, false
	}
	return true, live
}

func stoppingOr(f allocs.Fate) string {
	if f.Stopping {
		return "stopping (" + f.Reason + ")"
	}
	return "live (" + f.Reason + ")"
}

func describe(hs []allocs.Holding) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.Owner.String())
	}
	return strings.Join(parts, ", ")
}
