package release

import (
	"context"
	"errors"
	"fmt"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// Slots is what a release pass reads and records of the manager's slots.
// None of it runs a command or waits for one.
type Slots interface {
	// Copy returns the slots and how many releases of each have begun,
	// taken together.
	Copy() ([]view.Slot, map[string]uint64)
	// Proving reports whether slot id is closed until the proof of its
	// asker answered (which kicks the next pass).
	Proving(id string) bool
	// SetIncomplete says why the latest allocation read may miss
	// allocations ("" when it sees them all).
	SetIncomplete(why string)
	// Asked returns when the latest Reserve arrived.
	Asked() time.Time
	// Note sets the note of slot s only while the slot still shows the
	// tenancy s shows, with released releases begun as when s was copied.
	Note(s view.Slot, released uint64, n view.Note)
	// HoldFor reports whether the pass leaves slot s, whose owner ended,
	// to its next tenant for now (its spare ready).
	HoldFor(s view.Slot) bool
}

// Work is the work on slots that a release pass has the manager carry out.
type Work interface {
	// Release carries out the release of s in a run of its own, starting
	// it first when start is set, or returns the run already going.
	Release(ctx context.Context, s view.Slot, start bool) *Run
	// DisarmFree disarms the free slots' armed datasets (the token may
	// not see every namespace).
	DisarmFree(ctx context.Context) error
	// AdoptWithheld takes a spare withheld by an earlier run as decided
	// by d, and returns the slot as it is then.
	AdoptWithheld(ctx context.Context, v *allocs.View, s view.Slot, d decide.Decision) (view.Slot, error)
	// AdoptArmed takes the armed dataset of slot s for this run's own
	// when it is known to be fresh; why says why not.
	AdoptArmed(ctx context.Context, s view.Slot) (adopted bool, why string, err error)
}

// Armed is what a pass asks of the manager's armed datasets (package
// armed's Tracker): what decide asks, and whether the token may miss
// allocations.
type Armed interface {
	decide.Armed
	Incomplete() bool
}

// Passer starts the releases of a pass.
type Passer struct {
	log   hclog.Logger
	arm   Armed
	slots Slots
	work  Work
}

// NewPasser returns a Passer over the manager's slots and work.
func NewPasser(log hclog.Logger, arm Armed, slots Slots, work Work) *Passer {
	return &Passer{log: log, arm: arm, slots: slots, work: work}
}

// Start reads the API and starts the releases, from one read of the
// node's allocations that began after since (and after the latest Reserve
// arrived): every reserved slot that may be released (decide), and every
// release begun, finished. It returns the runs it started or joined,
// without waiting for them. With hold, a slot whose spare is ready is left
// to its next tenant for a while after its owner was first found ended
// (Slots.HoldFor). A slot that may not be released is kept, with why in
// its health: unhealthy when its owner is unknown or cannot be verified,
// or when something holds it that should not (conflict).
func (p *Passer) Start(ctx context.Context, nomad allocs.Nomad, since time.Time, hold bool) ([]*Run, error) {
	var errs []error
	// Decisions are made from this copy; a release starts only while the
	// slot still shows the tenancy decided from (the manager's
	// startReleaseLocked), and a note is set only while it does (Note:
	// rel, the releases begun by then, taken with the copy).
	slots, rel := p.slots.Copy()
	var reserved []view.Slot
	var runs []*Run
	for _, s := range slots {
		switch {
		case s.Unreadable:
			continue
		case p.slots.Proving(s.ID):
			// Closed until the proof of its asker answered, which
			// kicks the next pass (proof.go).
			continue
		case s.Old != nil || s.State == record.StateReleasing || s.State == record.StateDestroying:
			// Begun: the old dataset first, then the slot's own. Before
			// any read of the API: finishing it needs none.
			runs = append(runs, p.work.Release(ctx, s, false))
		}
		if s.State == record.StateReserved {
			reserved = append(reserved, s)
		}
	}
	// Every device's health warns while the token may not see every
	// namespace, whether or not a slot is in use.
	p.slots.SetIncomplete(nomad.Incomplete(ctx))
	if p.arm.Incomplete() {
		if err := p.work.DisarmFree(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(reserved) == 0 {
		return runs, errors.Join(errs...)
	}
	if asked := p.slots.Asked(); since.Before(asked) {
		since = asked // never older than the latest handover
	}
	began := time.Now()
	v, err := nomad.View(ctx, since)
	if err != nil {
		for _, s := range reserved {
			text := fmt.Sprintf("owner unverified: the node's allocations cannot be read (%v); its data is kept", err)
			if !s.Owner.Known() {
				text = fmt.Sprintf("owner unknown: the allocation it was handed to was never identified, and the node's allocations cannot be read (%v); its data is kept", err)
			}
			p.slots.Note(s, rel[s.ID], view.Note{Unhealthy: true, Text: text})
		}
		p.log.Warn("cannot read the node's allocations; keeping every in-use dataset", "error", err)
		return runs, errors.Join(errs...)
	}
	p.slots.SetIncomplete(v.Incomplete)
	reused := v.Began.Before(began) // read before this pass, not for it
	for _, s := range reserved {
		if reused && !s.Owner.Known() {
			// Its release would rest on no allocation holding the
			// device: only a read made for this pass, under the token
			// and the policies of now, may say so (an earlier read may
			// predate a widened token and miss the holder). The
			// periodic pass reads anew; so does any pass whose read is
			// older than the latest Reserve.
			continue
		}
		d := decide.Decide(ctx, p.log, p.arm, nomad, v, s, false)
		if s, err = p.work.AdoptWithheld(ctx, v, s, d); err != nil {
			errs = append(errs, err)
		}
		switch d.Kind {
		case decide.Adopt:
			adopted, why, err := p.work.AdoptArmed(ctx, s)
			switch {
			case err != nil:
				errs = append(errs, err)
			case adopted:
			case len(v.Holders(s.ID)) == 0:
				// Not fresh, and nobody holds it: released as any slot
				// whose owner was never identified.
				p.log.Info("releasing an earlier run's armed dataset that is not known to be fresh; no allocation holds it", "device", s.ID, "reason", why)
				runs = append(runs, p.work.Release(ctx, s, true))
			default:
				p.slots.Note(s, rel[s.ID], view.Note{Unhealthy: true, Text: fmt.Sprintf("owner unknown: armed by an earlier run of the plugin, and not known to be fresh (%s); its data is kept until no allocation holds it", why)})
			}
		case decide.InUse:
			p.slots.Note(s, rel[s.ID], view.Note{})
		case decide.StartRelease:
			if hold && p.slots.HoldFor(s) {
				continue
			}
			p.log.Info("owner ended", "device", s.ID, "owner", s.Owner.String(), "reason", d.Reason)
			runs = append(runs, p.work.Release(ctx, s, true))
		default:
			p.slots.Note(s, rel[s.ID], view.Note{Unhealthy: true, Text: d.Reason})
		}
	}
	return runs, errors.Join(errs...)
}
