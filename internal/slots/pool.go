package slots

// The pool's and the parent's health, as every slot's health shows it;
// the pool's check is package pool's (m.pool).

import (
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// reportUnreadable logs each dataset whose properties could not be parsed,
// once per manager: it is left alone, and only its own slot is unhealthy.
func (m *Manager) reportUnreadable(ds []zfs.Dataset) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range ds {
		if !m.reported[d.Name] {
			m.reported[d.Name] = true
			m.log.Error("dataset's properties cannot be read; leaving it alone", "dataset", d.Name, "error", d.Err)
		}
	}
}

// setUnavailable marks every slot unhealthy with reason, keeping what was
// last known of them (mountpoints, states) so that nothing is forgotten.
func (m *Manager) setUnavailable(cfg Config, reason string) {
	m.log.Warn("slots unavailable", "reason", reason)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.slots) == 0 {
		m.setSlotsLocked(view.Build(cfg, nil, reason, nil))
		return
	}
	slots := append([]Slot(nil), m.slots...)
	for i := range slots {
		slots[i].SetHealth(false, reason)
	}
	m.setSlotsLocked(slots)
}
