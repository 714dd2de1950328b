package slots

// A slot whose tenant ended, held with its spare for the allocation placed
// on it next (DefaultSpareHold).

import (
	"sync"
	"time"
)

// DefaultSpareHold is the default of holds.d: how long a release
// pass started by a kick leaves a slot whose owner has ended and whose spare
// is ready to the slot's next tenant.
// Nomad hands a freed device to the next allocation at once, and its
// Reserve, arriving some 100–300 ms after the owner's end, then hands over
// the spare as it would a fresh slot: in memory for an armed spare, the
// old dataset's fate written behind it, the asker identified by a read
// made at the same time (reserveFresh). Had the pass begun the release,
// the Reserve would wait for the fate to be written. A held slot
// is offered no less than before, and its data is kept meanwhile.
// Tests may set another (SetSpareHold, export_test.go).
const DefaultSpareHold = 500 * time.Millisecond

// holds are the slots held for their next tenant: one part of the
// manager, with its own lock. mu guards bySlot and d; it is the last lock
// taken (no other is taken while it is held), and never held while a
// command runs.
type holds struct {
	mu sync.Mutex
	// bySlot are the slots whose owner a kicked release pass found ended
	// and left to the next tenant's Reserve for d, by ID (holdFor).
	bySlot map[string]heldSlot
	// d is how long a slot is held (DefaultSpareHold; tests set another:
	// export_test.go).
	d time.Duration
}

func newHolds() *holds { return &holds{bySlot: map[string]heldSlot{}, d: DefaultSpareHold} }

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
// the hold (holds.d) ago. A kick is set for the end of the hold, so that the slot
// is released then if no Reserve came for it.
func (m *Manager) holdFor(s Slot) bool {
	if !m.holdable(s) {
		return false
	}
	hs := m.holds
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h, ok := hs.bySlot[s.ID]
	if !ok || h.owner != s.Owner.AllocID {
		h = heldSlot{owner: s.Owner.AllocID, seen: time.Now()}
		m.log.Debug("owner ended; the slot's spare waits for its next tenant", "device", s.ID, "owner", s.Owner.String(), "for", hs.d)
	}
	left := hs.d - time.Since(h.seen)
	if left <= 0 {
		delete(hs.bySlot, s.ID)
		return false
	}
	if !h.kickSet {
		h.kickSet = true
		id := s.ID
		time.AfterFunc(left, func() {
			hs.mu.Lock()
			if h, ok := hs.bySlot[id]; ok {
				h.kickSet = false // a pass that finds time left sets another
				hs.bySlot[id] = h
			}
			hs.mu.Unlock()
			m.Kick()
		})
	}
	hs.bySlot[s.ID] = h
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
// ended less than the hold (holds.d) ago, from a complete view with no other live
// holder, and the slot still qualifies (a spare ready, not surplus, its
// class not restoring).
func (m *Manager) heldForNext(s Slot) bool {
	if !s.Owner.Known() || !m.holdable(s) {
		return false
	}
	m.holds.mu.Lock()
	defer m.holds.mu.Unlock()
	h, ok := m.holds.bySlot[s.ID]
	return ok && h.owner == s.Owner.AllocID && time.Since(h.seen) < m.holds.d
}
