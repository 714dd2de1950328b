package slots

// A dataset's fate, what its release records on ZFS first, is written by
// package fate (m.fates: Write before a handover, Behind an armed spare's
// handover); this file is the manager's side of it.

import (
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/tenancy"
)

// fateFirst returns an error while the fate of slot id's old dataset,
// due behind its spare's handover, is refused, and nil otherwise; it
// runs no command. The owner of the tenant the spare went to is recorded
// only after that fate (recordOwner, which leaves it pending meanwhile):
// until then ZFS shows the handover unrecorded beside the old dataset
// still in use, which a later run reads as a spare it withholds
// (pair.roles); with both owners recorded it would read a conflict.
func (m *Manager) fateFirst(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[id]
	if !ok || !m.slots[i].FateDue() {
		return nil
	}
	old := m.slots[i].Old.Dataset
	if err := m.ten.FateRefused(old); err != nil {
		return fmt.Errorf("it waits for the fate of the previous dataset %s, which ZFS refused: %w", old, err)
	}
	return nil
}

// fateSlots is the manager's side of package fate (fate.Slots).
type fateSlots struct{ m *Manager }

func (f fateSlots) Tenancy(fn func(t *tenancy.Record) bool) { f.m.tenancy(fn) }
func (f fateSlots) Slot(id string) (Slot, bool)             { return f.m.slot(id) }
func (f fateSlots) Update(id string, fn func(*Slot))        { f.m.updateSlot(id, fn) }
func (f fateSlots) Kick()                                   { f.m.Kick() }

func (f fateSlots) Class(name string) Class {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	return reconcile.ClassByName(f.m.cfg, name)
}

func (f fateSlots) Started(class string) {
	if obs := f.m.observer(); obs != nil {
		obs.ReleaseStarted(class)
	}
}
