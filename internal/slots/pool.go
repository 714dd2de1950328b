package slots

// The pool's and the parent's health, as every slot's health shows it.

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// checkPoolRecent is checkPool, skipped when a check found the pool ONLINE
// less than poolCheckAge ago.
func (m *Manager) checkPoolRecent(ctx context.Context, cfg Config) (string, error) {
	m.mu.Lock()
	recent := !m.poolOKAt.IsZero() && time.Since(m.poolOKAt) < poolCheckAge
	m.mu.Unlock()
	if recent {
		return "", nil
	}
	return m.checkPool(ctx, cfg)
}

// checkPool returns why the pool cannot be used, or "" when it is ONLINE.
// A check cut short by ctx says nothing of the pool: it returns ctx's
// error instead, and no slot is to be marked for it.
func (m *Manager) checkPool(ctx context.Context, cfg Config) (string, error) {
	reason := m.poolReason(ctx, cfg)
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("checking the pool: %w", err)
	}
	m.mu.Lock()
	m.poolOKAt = time.Time{}
	if reason == "" {
		m.poolOKAt = time.Now()
	}
	m.mu.Unlock()
	return reason, nil
}

func (m *Manager) poolReason(ctx context.Context, cfg Config) string {
	pool := cfg.Pool()
	health, err := m.zfs.PoolHealth(ctx, pool)
	switch {
	case errors.Is(err, zfs.ErrNotExist):
		return fmt.Sprintf("pool %s is not imported", pool)
	case err != nil:
		return fmt.Sprintf("pool %s cannot be read: %v", pool, err)
	case health != "ONLINE":
		return fmt.Sprintf("pool %s is %s", pool, health)
	}
	return ""
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
