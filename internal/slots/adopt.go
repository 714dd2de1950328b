package slots

// Adoption of armed datasets: an earlier run's armed dataset with no
// owner recorded is handed to no one until a complete view of the
// allocations and an empty root prove that nobody has it (see package armed and
// docs/release-lifecycle.md, "Armed datasets"); disarmFree records this
// run's free armed datasets free once the views are found incomplete.

import (
	"context"
	"errors"
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
)

// unrecordedSlot is unrecorded for a slot as last seen: its owner is not
// recorded on its armed dataset.
func unrecordedSlot(s Slot) bool {
	return s.Armed != "" && s.State == record.StateReserved && !s.Stamped.Known()
}

// adoptArmed takes the armed dataset of slot s, which decide.MayAdopt allowed,
// for this run's own, under the slot's lock, when the slot is still as s
// shows it and the dataset's root, mounted, is empty. On return the slot is
// free (adopted) or as it was, with why it was not adopted.
func (m *Manager) adoptArmed(ctx context.Context, s Slot) (adopted bool, why string, err error) {
	unlock, err := m.lockSlot(ctx, s.ID, "adopt")
	if err != nil {
		return false, "", fmt.Errorf("adopting device %s: %w", s.ID, err)
	}
	defer unlock()
	cur, ok := m.slot(s.ID)
	m.mu.Lock()
	_, identified := m.ten.Owner(s.ID)
	want := hostfs.FlagsFor(reconcile.ClassByName(m.cfg, s.Class).SlotProps())
	m.mu.Unlock()
	switch {
	case !ok || cur.Dataset != s.Dataset || cur.Armed != s.Armed || cur.State != record.StateReserved || cur.Owner.Known() || identified:
		return false, "it changed meanwhile", nil
	case cur.Mountpoint == "" || !cur.OK:
		return false, "it is not mounted", nil
	}
	if why := mounts.MayBeWritten(ctx, cur.Dataset, cur.Mountpoint, want); why != "" {
		return false, why, nil
	}
	m.arm.Adopt(cur.Armed)
	m.setNote(s.ID, note{})
	m.updateSlot(s.ID, func(x *Slot) { x.State = record.StateFree })
	m.log.Info("armed dataset of an earlier run adopted: empty, and no allocation has had it", "device", s.ID, "dataset", cur.Dataset, "token", cur.Armed)
	return true, "", nil
}

// disarmFree records free, as an earlier version would have made them, the
// free armed datasets of this run, once the allocation views are known to
// be incomplete: a later run could not adopt them (no incomplete view
// proves that nobody holds a device), and would keep them from every
// tenant. One zfs command per dataset, once; a busy slot is left for the
// next pass.
func (m *Manager) disarmFree(ctx context.Context) error {
	var errs []error
	for _, s := range m.Slots() {
		if s.State != record.StateFree || s.Armed == "" || !m.arm.Ours(s.Armed) {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, ownerLockWait)
		unlock, err := m.lockSlot(lctx, s.ID, "disarm")
		cancel()
		if err != nil {
			continue
		}
		cur, ok := m.slot(s.ID)
		if ok && cur.State == record.StateFree && cur.Armed == s.Armed && cur.Dataset == s.Dataset {
			if err := m.zfs.Set(ctx, cur.Dataset, record.PropState, string(record.To(record.Disarm))); err != nil {
				errs = append(errs, fmt.Errorf("recording %s free (not armed): %w", cur.Dataset, err))
			} else {
				m.updateSlot(s.ID, func(x *Slot) { x.Armed = "" })
			}
		}
		unlock()
	}
	return errors.Join(errs...)
}
