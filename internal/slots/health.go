package slots

// What a slot's health says beyond what ZFS shows: why an in-use slot is
// kept (notes), why its tenant started empty, that allocation views may
// miss namespaces, that a fate written behind a handover was refused; and
// the rule that keeps a class schedulable while its slots are released.
// deriveLocked adds them to each slot's view whenever it is published
// (setSlotsLocked).

import (
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// note is what the manager knows of an in-use slot beyond what ZFS says:
// why it is kept, and whether that makes it unhealthy.
type note struct {
	text      string
	unhealthy bool
}

// setNote sets (or, with a zero note, clears) what is known of an in-use
// slot beyond ZFS, and publishes it in the slot's health.
func (m *Manager) setNote(id string, n note) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.noteLocked(id, n) {
		m.setSlotsLocked(append([]Slot(nil), m.slots...))
	}
}

// noteLocked sets (or, with a zero note, clears) the note of slot id,
// with m.mu held, and reports whether it changed; the caller publishes
// it (setSlotsLocked).
func (m *Manager) noteLocked(id string, n note) bool {
	if m.notes[id] == n {
		return false
	}
	if n == (note{}) {
		delete(m.notes, id)
	} else {
		m.notes[id] = n
	}
	return true
}

// sinceLocked returns the index of slot s in m.slots while it still
// serves s's dataset and no release of it has begun since released was
// read (m.releases), with m.mu held: a decision made from s, outside the
// lock, still bears on the slot. The slot may otherwise serve a new
// dataset of the same name.
func (m *Manager) sinceLocked(s Slot, released uint64) (int, bool) {
	i, ok := m.byID[s.ID]
	if !ok || m.releases[s.ID] != released || m.slots[i].Dataset != s.Dataset {
		return 0, false
	}
	return i, true
}

// setEmptyStart records why the tenant of slot id started empty despite
// its class's restore = "best-effort", and publishes it in the slot's
// health description for as long as the tenancy lasts.
func (m *Manager) setEmptyStart(id, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.emptyStarts[id] = why
	m.setSlotsLocked(append([]Slot(nil), m.slots...))
}

// setIncomplete records why allocation views may miss allocations ("" when
// they do not) and publishes it in every device's health description.
func (m *Manager) setIncomplete(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.incomplete == reason {
		return
	}
	if reason != "" {
		m.log.Warn("the Nomad token may not see every namespace: datasets of allocations it cannot see are never released or handed over", "reason", reason)
	}
	m.incomplete = reason
	m.arm.SetIncomplete(reason != "")
	m.setSlotsLocked(append([]Slot(nil), m.slots...))
}

// keepSchedulable offers a slot that is being released, and is otherwise
// sound, as healthy when no instance of its class is healthy. Nomad's
// scheduler counts healthy instances when it checks a node: a job
// evaluated while none is healthy is blocked with the node's class marked
// ineligible, and a device that turns healthy later does not re-evaluate
// it, so the job would wait until something else changed. Placed on a slot
// being released, its Reserve waits for the fresh dataset.
func keepSchedulable(slots []Slot) {
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

// deriveLocked computes a slot's Healthy and HealthDesc from its health as
// ZFS shows it, the note on it (an in-use slot kept, with why) and the
// warning that the allocation view may be incomplete. mu is held.
func (m *Manager) deriveLocked(s *Slot) {
	s.Healthy, s.HealthDesc = s.OK, s.Why
	if s.State == record.StateReserved {
		if o, ok := m.owners[s.ID]; ok && !s.Stamped.Known() {
			s.Owner = o
		} else if o, ok := m.unproven[s.ID]; ok && !s.Stamped.Known() {
			s.Owner = o
		}
		if n, ok := m.notes[s.ID]; ok && s.OK {
			s.HealthDesc = n.text
			s.Healthy = !n.unhealthy
		}
		if why, ok := m.emptyStarts[s.ID]; ok && s.Healthy && s.HealthDesc == "" {
			s.HealthDesc = why
		}
	}
	if s.FateDue() {
		if err := m.fateRefused[s.Old.Dataset]; err != nil {
			// Served from the spare meanwhile: healthy, and saying why the
			// data of the previous tenancy is still in place.
			s.HealthDesc = strings.TrimPrefix(s.HealthDesc+"; the previous dataset "+s.Old.Dataset+" is kept: "+blockedText(err), "; ")
		}
	}
	if m.incomplete != "" {
		s.HealthDesc = strings.TrimPrefix(s.HealthDesc+"; warning: "+m.incomplete, "; ")
	}
}

// oneLine makes a text safe for a health description or a log line: control
// characters are replaced, so nothing a job submitter chose can add lines.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
