package slots

// Owners identified at Reserve and recorded on ZFS behind it: the release
// pass records them (recordOwners) before it decides any release.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// ownersPending reports whether an owner identified at Reserve is not
// recorded yet.
func (m *Manager) ownersPending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ten.Pending()
}

// recordOwners records the owners identified at Reserve and not recorded
// yet (recordOwner), leaving those of busy slots for later.
func (m *Manager) recordOwners(ctx context.Context) error {
	m.mu.Lock()
	pending := m.ten.Owners()
	m.mu.Unlock()
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(pending)) {
		if err := m.recordOwner(ctx, id, pending[id]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recordOwner writes an owner identified at Reserve on the slot's dataset
// (one zfs command), unless the slot changed since; a zero o records that
// an armed dataset whose owner was never identified was handed over. When other work holds
// the slot, the owner stays pending for the next pass.
func (m *Manager) recordOwner(ctx context.Context, id string, o record.Owner) error {
	if err := m.fateFirst(id); err != nil {
		return fmt.Errorf("recording the owner of %s: %w", id, err)
	}
	lctx, cancel := context.WithTimeout(ctx, ownerLockWait)
	unlock, err := m.lockSlot(lctx, id, "record owner")
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("recording the owner of %s: %w", id, ctx.Err())
		}
		return nil // other work on the slot: still pending, the next pass records it
	}
	defer unlock()
	s, ok := m.slot(id)
	m.mu.Lock()
	cur, pending := m.ten.Owner(id)
	m.mu.Unlock()
	if !pending || cur != o {
		// Released and reserved again since o was identified: o belongs to
		// an earlier dataset of this slot.
		return nil
	}
	if !ok || s.State != record.StateReserved || s.Stamped.Known() {
		m.dropOwner(id, o)
		return nil
	}
	if s.FateDue() {
		return nil // see fateFirst
	}
	switch {
	case o.Known():
		if err := m.zfs.Set(ctx, s.Dataset, record.PropOwner, o.Encode()); err != nil {
			return fmt.Errorf("recording the owner of %s: %w", id, err)
		}
	case s.Armed != "":
		// A handover whose owner was never identified: what is recorded
		// is that the dataset was handed over (package armed). A dataset not
		// armed says so already.
		if err := m.zfs.Set(ctx, s.Dataset, record.PropState, string(record.To(record.RecordHandover))); err != nil {
			return fmt.Errorf("recording the handover of %s: %w", id, err)
		}
	}
	m.dropOwner(id, o)
	m.updateSlot(id, func(x *Slot) {
		if o.Known() {
			x.Owner, x.Stamped = o, o
		}
		x.Armed = ""
	})
	m.log.Debug("handover recorded", "device", id, "owner", o.String())
	m.goTend(ctx, id) // the spare, now that its handover is recorded
	return nil
}

// dropOwner forgets the pending owner of slot id once o is recorded (or
// moot), unless another was queued meanwhile: a fresh handover (package
// reserve) queues the handover of an armed spare (a zero owner) before
// its read tells who asked, and the owner that read identifies, queued
// while the handover was written, stays pending for the next pass.
func (m *Manager) dropOwner(id string, o record.Owner) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ten.DropOwner(id, o)
}
