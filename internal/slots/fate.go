package slots

// A dataset's fate: what its release records on ZFS first (archived, or
// destroying), before anything else is done with it. It is written before
// the slot is handed to another tenant (writeFate), but for an armed
// spare's handover, which is made in memory and has the fate written
// behind it (writeFateBehind: see handOverSpare and pair.roles).

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// writeFate records, under the slot's lock (held by the caller), that the
// release of the dataset of cur (of class c, owned by o) has begun: the
// owner when it is not recorded yet, then the dataset's fate (archived,
// or destroying when the class says so), the state last. The slot's
// pending owner and note go (forgetTenancy). It returns the slot's state
// from now on. When ZFS refuses (a full pool), the data is kept and the
// slot is unhealthy with why. spare names the dataset that serves
// meanwhile, for the log ("" when none).
func (m *Manager) writeFate(ctx context.Context, c Class, cur Slot, o record.Owner, spare string) (record.State, error) {
	if err := m.recordFate(ctx, c, cur, o, spare); err != nil {
		// A write cut short by the caller's deadline (a Reserve's
		// reserve_timeout) says nothing about ZFS: a reason found before
		// it, such as a full pool, stays the slot's health.
		m.mu.Lock()
		noted := m.ten.Noted(cur.ID)
		m.mu.Unlock()
		if ctx.Err() == nil || !noted {
			m.setNote(cur.ID, note{Unhealthy: true, Text: view.BlockedText(err)})
		}
		return "", fmt.Errorf("starting the release of %s: %w", cur.ID, err)
	}
	m.forgetTenancy(cur.ID)
	return release.FateState(c), nil
}

// recordFate writes the fate of x's dataset (of class c, owned by o: its
// owner too when x does not record it), in one zfs command, and logs the
// release's start: what writeFate and writeFateBehind write on ZFS.
func (m *Manager) recordFate(ctx context.Context, c Class, x Slot, o record.Owner, spare string) error {
	props := map[string]string{record.PropState: string(record.To(release.FateEvent(c)))}
	if o.Known() && !x.Stamped.Known() {
		props[record.PropOwner] = o.Encode()
	}
	if err := m.apply.SetProps(ctx, x.Dataset, props); err != nil {
		return err
	}
	m.log.Info("release started", "device", x.ID, "dataset", x.Dataset, "owner", o.String(), "on_release", c.OnRelease, "spare", spare)
	if obs := m.observer(); obs != nil {
		obs.ReleaseStarted(x.Class)
	}
	return nil
}

// forgetTenancy drops what the manager knew of slot id's tenancy beyond
// ZFS (its pending owner, note, empty start) once its release has begun,
// and counts the release (tenancy.Record.Ended).
func (m *Manager) forgetTenancy(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ten.Ended(id)
}

// writeFateBehind records the fate of the old dataset of slot view cur,
// which is due (fateDue), under the slot's lock (held by the caller), and
// returns the slot as it is then: no longer due. When ZFS refuses (a full
// pool) the old dataset stays in use on ZFS, data and all, the slot's
// health says why (m.ten's refused fates: it is not the tenancy's note, which the
// new tenant's own work sets and clears), and the next work on the slot
// writes it again (tendSlotLocked). Once it lands the new tenant's owner
// can be recorded (recordOwner).
func (m *Manager) writeFateBehind(ctx context.Context, cur Slot) (Slot, error) {
	old := *cur.Old
	m.mu.Lock()
	c := reconcile.ClassByName(m.cfg, old.Class)
	m.mu.Unlock()
	if err := m.recordFate(ctx, c, old, old.Owner, cur.Dataset); err != nil {
		m.mu.Lock()
		if errors.Is(err, zfs.ErrNotExist) {
			m.ten.FateLanded(old.Dataset) // gone: a read of the slot says so
		} else if ctx.Err() == nil {
			m.ten.RefuseFate(old.Dataset, err)
		}
		m.setSlotsLocked(append([]Slot(nil), m.slots...))
		m.mu.Unlock()
		return Slot{}, fmt.Errorf("slot %s: the fate of its previous dataset %s: %w", cur.ID, old.Dataset, err)
	}
	m.mu.Lock()
	m.ten.FateLanded(old.Dataset)
	m.mu.Unlock()
	m.updateSlot(cur.ID, func(x *Slot) {
		if x.FateDue() && x.Old.Dataset == old.Dataset {
			o := *x.Old // shared with earlier copies of the view
			o.State = release.FateState(c)
			x.Old, x.Sib = &o, reconcile.NameReleasing
		}
	})
	m.Kick() // the new tenant's owner, pending until now (recordOwner)
	now, _ := m.slot(cur.ID)
	return now, nil
}

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

// forgetFatesLocked drops, with m.mu held, the refusals of fates that the
// slot views read from ZFS (slots, about to be published) show no longer
// due: landed, or left by other means (the dataset destroyed by hand, say).
// A view not read from ZFS (the slots reset by a new configuration until
// the next read) says nothing of them.
func (m *Manager) forgetFatesLocked(slots []Slot) {
	m.ten.KeepFates(func(ds string) bool {
		return slices.ContainsFunc(slots, func(s Slot) bool { return s.FateDue() && s.Old.Dataset == ds })
	})
}

// fateBehindLocked writes the fate of cur's old dataset when it is due
// (writeFateBehind), first in any tending of the slot (tendSlotLocked),
// under the slot's lock (held by the caller). A release of the slot's own
// dataset started meanwhile (its new tenant ended) writes that dataset's
// fate before, with its owner (startReleaseLocked): a later run then
// finds one dataset in use, the old one, and one on its way out. It returns the slot as it is then; it gives up
// the lock and returns an error when the fate is refused, but for a
// dataset gone (destroyed by hand): a read of the slot then shows so.
func (m *Manager) fateBehindLocked(ctx context.Context, cur Slot, unlock func()) (Slot, error) {
	if !cur.FateDue() {
		return cur, nil
	}
	now, err := m.writeFateBehind(ctx, cur)
	switch {
	case errors.Is(err, zfs.ErrNotExist):
		return cur, nil
	case err != nil:
		unlock()
		return Slot{}, fmt.Errorf("%w; its data is kept", err)
	}
	return now, nil
}
