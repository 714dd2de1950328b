// Package pool checks the health of the slots' pool for the slot manager:
// a Sync checks it every time (Check), the work on one slot trusts a
// check that found it ONLINE a moment ago (Recent). What a pool that
// cannot be used does to the slots' health is the manager's.
package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// CheckAge is how long a release trusts the last check that found the
// pool ONLINE. A pool that fails meanwhile fails the release's commands,
// which keep the data and mark the slot unhealthy; the next Sync names why.
const CheckAge = 5 * time.Second

// ZFS reads a pool's health (the manager's ZFS).
type ZFS interface {
	PoolHealth(ctx context.Context, pool string) (string, error)
}

// Checker checks the pool: one part of the slot manager, with its own
// lock. mu guards okAt; it is the last lock taken (the manager's mu is
// never held while it is), and never held while a command runs.
type Checker struct {
	zfs ZFS
	mu  sync.Mutex
	// okAt is when a check last found the pool ONLINE; zero after one did
	// not.
	okAt time.Time
}

// New returns a Checker that reads the pool's health through z.
func New(z ZFS) *Checker { return &Checker{zfs: z} }

// Recent is Check, skipped when a check found the pool ONLINE less than
// CheckAge ago.
func (p *Checker) Recent(ctx context.Context, cfg reconcile.Config) (string, error) {
	p.mu.Lock()
	recent := !p.okAt.IsZero() && time.Since(p.okAt) < CheckAge
	p.mu.Unlock()
	if recent {
		return "", nil
	}
	return p.Check(ctx, cfg)
}

// Check returns why the pool cannot be used, or "" when it is ONLINE.
// A check cut short by ctx says nothing of the pool: it returns ctx's
// error instead, and no slot is to be marked for it.
func (p *Checker) Check(ctx context.Context, cfg reconcile.Config) (string, error) {
	reason := p.reason(ctx, cfg)
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("checking the pool: %w", err)
	}
	p.mu.Lock()
	p.okAt = time.Time{}
	if reason == "" {
		p.okAt = time.Now()
	}
	p.mu.Unlock()
	return reason, nil
}

func (p *Checker) reason(ctx context.Context, cfg reconcile.Config) string {
	pool := cfg.Pool()
	health, err := p.zfs.PoolHealth(ctx, pool)
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
