package view

// What a slot's health says beyond what ZFS shows: why an in-use slot is
// kept (notes), why its tenant started empty, that allocation views may
// miss namespaces, that a fate written behind a handover was refused; and
// the rule that keeps a class schedulable while its slots are released.
// The slot manager lays them over each slot's view whenever it publishes
// one (its setSlotsLocked): Known.Derive, then KeepSchedulable.

import (
	"fmt"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// Note is what the manager knows of an in-use slot beyond what ZFS says:
// why it is kept, and whether that makes it unhealthy.
type Note struct {
	Text      string
	Unhealthy bool
}

// Known is what the slot manager knows of its slots beyond what ZFS
// shows. Its maps are the manager's own, read under its lock while
// Derive runs.
type Known struct {
	// Owners are owners identified at Reserve and not yet recorded, by
	// ID; Unproven the allocations this run's armed datasets were handed
	// to before their proof, by ID.
	Owners, Unproven map[string]record.Owner
	// Notes explain why an in-use slot is kept, by ID.
	Notes map[string]Note
	// EmptyStarts say, by ID, why a tenant started empty.
	EmptyStarts map[string]string
	// FateRefused is, by dataset, what ZFS answered the fate written
	// behind a handover.
	FateRefused map[string]error
	// Incomplete is why allocation views may miss allocations, or "".
	Incomplete string
}

// KeepSchedulable offers a slot that is being released, and is otherwise
// sound, as healthy when no instance of its class is healthy. Nomad's
// scheduler counts healthy instances when it checks a node: a job
// evaluated while none is healthy is blocked with the node's class marked
// ineligible, and a device that turns healthy later does not re-evaluate
// it, so the job would wait until something else changed. Placed on a slot
// being released, its Reserve waits for the fresh dataset.
func KeepSchedulable(slots []Slot) {
	healthy := map[string]bool{}
	for _, s := range slots {
		healthy[s.Class] = healthy[s.Class] || s.Healthy
	}
	for i := range slots {
		s := &slots[i]
		if healthy[s.Class] || !s.InRelease || s.Surplus || s.HealthDesc != s.Why {
			continue
		}
		s.Healthy = true
		s.HealthDesc = "fresh soon (" + s.HealthDesc + "); offered meanwhile, as the class has no other healthy instance: a Reserve waits for the fresh dataset"
	}
}

// Derive computes a slot's Healthy and HealthDesc from its health as ZFS
// shows it, the note on it (an in-use slot kept, with why) and the
// warning that the allocation view may be incomplete.
func (k Known) Derive(s *Slot) {
	s.Healthy, s.HealthDesc = s.OK, s.Why
	if s.State == record.StateReserved {
		if o, ok := k.Owners[s.ID]; ok && !s.Stamped.Known() {
			s.Owner = o
		} else if o, ok := k.Unproven[s.ID]; ok && !s.Stamped.Known() {
			s.Owner = o
		}
		if n, ok := k.Notes[s.ID]; ok && s.OK {
			s.HealthDesc = n.Text
			s.Healthy = !n.Unhealthy
		}
		if why, ok := k.EmptyStarts[s.ID]; ok && s.Healthy && s.HealthDesc == "" {
			s.HealthDesc = why
		}
	}
	if s.FateDue() {
		if err := k.FateRefused[s.Old.Dataset]; err != nil {
			// Served from the spare meanwhile: healthy, and saying why the
			// data of the previous tenancy is still in place.
			s.HealthDesc = strings.TrimPrefix(s.HealthDesc+"; the previous dataset "+s.Old.Dataset+" is kept: "+BlockedText(err), "; ")
		}
	}
	if k.Incomplete != "" {
		s.HealthDesc = strings.TrimPrefix(s.HealthDesc+"; warning: "+k.Incomplete, "; ")
	}
}

// BlockedText is what a slot's health says of a fate that ZFS refused.
func BlockedText(err error) string {
	return fmt.Sprintf("release blocked: %v; its data is kept", err)
}

// OneLine makes a text safe for a health description or a log line:
// control characters are replaced, so nothing a job submitter chose can
// add lines.
func OneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
