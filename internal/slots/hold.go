package slots

// A slot whose tenant ended, held with its spare for the allocation placed
// on it next (DefaultSpareHold).

import "time"

// DefaultSpareHold is the default of Manager.spareHold: how long a release
// pass started by a kick leaves a slot whose owner has ended and whose spare
// is ready to the slot's next tenant.
// Nomad hands a freed device to the next allocation at once, and its
// Reserve, arriving some 100–300 ms after the owner's end, then hands over
// the spare as it would a fresh slot: in memory for an armed spare, the
// old dataset's fate written behind it, the asker identified by a read
// made at the same time (reserveFresh). Had the pass begun the release,
// the Reserve would wait for the fate to be written. A held slot
// is offered no less than before, and its data is kept meanwhile.
// NewManager sets it; tests may set another (Manager.spareHold).
const DefaultSpareHold = 500 * time.Millisecond

// heldSlot is a slot held for its next tenant: whose end was seen when,
// and whether a kick is set for when the hold is over.
type heldSlot struct {
	owner   string // the ended owner's allocation ID
	seen    time.Time
	kickSet bool
}

// holdFor reports whether a kicked pass leaves slot s (whose owner has
// ended, decided from a read that showed no other live holder) alone for
// now: its spare is ready, and its owner's end was first seen less than
// m.spareHold ago. A kick is set for the end of the hold, so that the slot
// is released then if no Reserve came for it.
func (m *Manager) holdFor(s Slot) bool {
	if !m.holdable(s) {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.held[s.ID]
	if !ok || h.owner != s.Owner.AllocID {
		h = heldSlot{owner: s.Owner.AllocID, seen: time.Now()}
		m.log.Debug("owner ended; the slot's spare waits for its next tenant", "device", s.ID, "owner", s.Owner.String(), "for", m.spareHold)
	}
	left := m.spareHold - time.Since(h.seen)
	if left <= 0 {
		delete(m.held, s.ID)
		return false
	}
	if !h.kickSet {
		h.kickSet = true
		id := s.ID
		time.AfterFunc(left, func() {
			m.mu.Lock()
			if h, ok := m.held[id]; ok {
				h.kickSet = false // a pass that finds time left sets another
				m.held[id] = h
			}
			m.mu.Unlock()
			m.Kick()
		})
	}
	m.held[s.ID] = h
	return true
}

// holdable reports whether slot s may be held for its next tenant: its
// spare is ready, it is not surplus, and its class does not restore (the
// replacement of its owner gets the owner's data, not a spare).
func (m *Manager) holdable(s Slot) bool {
	return s.Spare != "" && !s.Surplus && s.ok && !restores(m.classOf([]string{s.ID}))
}

// heldForNext reports whether reserved slot s is held for its next tenant
// (holdFor) now: a release pass found its owner, still the one s shows,
// ended less than m.spareHold ago, from a complete view with no other live
// holder, and the slot still qualifies (a spare ready, not surplus, its
// class not restoring).
func (m *Manager) heldForNext(s Slot) bool {
	if !s.Owner.Known() || !m.holdable(s) {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.held[s.ID]
	return ok && h.owner == s.Owner.AllocID && time.Since(h.seen) < m.spareHold
}
