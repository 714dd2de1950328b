package slots

import "time"

// SetSpareHold sets how long a kicked release pass holds a slot for its
// next tenant (DefaultSpareHold otherwise), for tests whose steps between
// the pass and the Reserve take real zfs commands: on a busy machine those
// can outlast the default. It applies to holds under way too (their time
// left is counted from when their owner's end was seen).
func (m *Manager) SetSpareHold(d time.Duration) {
	m.holds.mu.Lock()
	defer m.holds.mu.Unlock()
	m.holds.d = d
}

// HeldForNext reports whether slot id is held for its next tenant now: a
// kicked pass found its owner ended less than the hold ago (holdFor).
func (m *Manager) HeldForNext(id string) bool {
	m.holds.mu.Lock()
	defer m.holds.mu.Unlock()
	h, ok := m.holds.bySlot[id]
	return ok && time.Since(h.seen) < m.holds.d
}
