package slots

import "time"

// SetSpareHold sets how long a kicked release pass holds a slot for its
// next tenant (DefaultSpareHold otherwise), for tests whose steps between
// the pass and the Reserve take real zfs commands: on a busy machine those
// can outlast the default.
func (m *Manager) SetSpareHold(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spareHold = d
}

// Holds reports whether slot id is held for its next tenant now (holdFor).
func (m *Manager) Holds(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.held[id]
	return ok
}
