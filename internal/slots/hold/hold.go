// Package hold holds the slots whose tenant ended, each with its spare,
// for the allocation placed on it next (Default).
package hold

import (
	"sync"
	"time"
)

// Default is the default of how long a hold lasts: how long a release
// pass started by a kick leaves a slot whose owner has ended and whose spare
// is ready to the slot's next tenant.
// Nomad hands a freed device to the next allocation at once, and its
// Reserve, arriving some 100–300 ms after the owner's end, then hands over
// the spare as it would a fresh slot: in memory for an armed spare, the
// old dataset's fate written behind it, the asker identified by a read
// made at the same time (package reserve). Had the pass begun the release,
// the Reserve would wait for the fate to be written. A held slot
// is offered no less than before, and its data is kept meanwhile.
// Tests may set another (the manager's SetSpareHold, export_test.go).
const Default = 500 * time.Millisecond

// Holds are the slots held for their next tenant: one part of the slot
// manager, with its own lock. mu guards bySlot and d; it is the last lock
// taken (no other is taken while it is held), and never held while a
// command runs.
type Holds struct {
	mu sync.Mutex
	// bySlot are the slots whose owner a kicked release pass found ended
	// and left to the next tenant's Reserve for d, by ID (Hold).
	bySlot map[string]held
	// d is how long a slot is held (Default; tests set another: Set).
	d time.Duration
}

// New returns holds that last Default.
func New() *Holds { return &Holds{bySlot: map[string]held{}, d: Default} }

// held is a slot held for its next tenant: whose end was seen when,
// and whether a kick is set for when the hold is over.
type held struct {
	owner   string // the ended owner's allocation ID
	seen    time.Time
	kickSet bool
}

// Set sets how long a slot is held. It applies to holds under way too
// (their time left is counted from when their owner's end was seen).
func (hs *Holds) Set(d time.Duration) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.d = d
}

// Duration returns how long a slot is held.
func (hs *Holds) Duration() time.Duration {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.d
}

// Hold reports whether slot id, whose owner (an allocation ID) a kicked
// pass found ended, is left alone for now: its owner's end was first seen
// less than the hold ago. first says that this call is the first to see
// that owner's end; the caller logs it. When the slot is held, kick is
// called at the end of the hold (once a hold, from a timer), so that the
// slot is released then if no Reserve came for it.
func (hs *Holds) Hold(id, owner string, kick func()) (ok, first bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h, seen := hs.bySlot[id]
	if !seen || h.owner != owner {
		h, first = held{owner: owner, seen: time.Now()}, true
	}
	left := hs.d - time.Since(h.seen)
	if left <= 0 {
		delete(hs.bySlot, id)
		return false, first
	}
	if !h.kickSet {
		h.kickSet = true
		time.AfterFunc(left, func() {
			hs.mu.Lock()
			if h, ok := hs.bySlot[id]; ok {
				h.kickSet = false // a pass that finds time left sets another
				hs.bySlot[id] = h
			}
			hs.mu.Unlock()
			kick()
		})
	}
	hs.bySlot[id] = h
	return true, first
}

// Holding reports whether slot id is held now for the next tenant after
// owner (an allocation ID): Hold found owner ended less than the hold ago.
// With owner "", any owner's hold counts.
func (hs *Holds) Holding(id, owner string) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h, ok := hs.bySlot[id]
	return ok && (owner == "" || h.owner == owner) && time.Since(h.seen) < hs.d
}
