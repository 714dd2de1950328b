package slots

// Reserve on fresh slots: the manager's side of the rounds' fresh handover
// (reserve's fresh): the one zfs command of each, and who asked.

import (
	"context"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reserve"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// identifyGrace is how long Reserve on a fresh slot waits, after its one
// zfs command, for the allocation read that tells who asked
// (reserve.IdentifyGrace); a prepared slot's proof reads as long.
const identifyGrace = reserve.IdentifyGrace

// releasesOf returns how many releases of slot id have begun (tenancy.Record.Ended).
func (m *Manager) releasesOf(id string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ten.Releases(id)
}

// identified records what the read made for a Reserve says of slot s,
// as the rounds of Reserve (package reserve) handed it over: its owner o
// (to record on ZFS, and in the slot's view), or, when why says it is unknown, a note that keeps the
// data; for an armed dataset, that it was handed over (recordOwner). It
// does so only while the slot still serves that dataset, reserved, with no
// owner recorded and no release begun since the handover (released is
// releasesOf then), under one hold of m.mu: the read runs with no lock
// held, and meanwhile the asker may have ended, its dataset been released
// and the slot handed to another tenant (whose dataset may bear the same
// name), whose pending owner must not be replaced. It reports whether the
// slot was still so.
func (m *Manager) identified(s Slot, released uint64, o record.Owner, why string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.sinceLocked(s, released)
	if !ok || m.slots[i].State != record.StateReserved || m.slots[i].Stamped.Known() {
		return false
	}
	if why == "" || s.Armed != "" {
		// The owner to record, or, unknown, that an armed dataset was
		// handed over (recordOwner).
		m.ten.SetOwner(s.ID, o)
	}
	slots := append([]Slot(nil), m.slots...)
	if why != "" {
		m.noteLocked(s.ID, note{Unhealthy: true, Text: "owner unknown: " + why + "; its data is kept until no allocation holds it"})
	} else {
		m.noteLocked(s.ID, note{})
		slots[i].Owner = o
		m.vers[s.ID]++
	}
	m.setSlotsLocked(slots)
	return true
}

// markReserved records a fresh slot as reserved, under its lock, after
// checking that it is still fresh and mounted where it says: in memory for
// a dataset armed by this run, else with one zfs command.
func (m *Manager) markReserved(ctx context.Context, id string) (Slot, error) {
	unlock, err := m.lockSlot(ctx, id, "reserve")
	if err != nil {
		return Slot{}, fmt.Errorf("reserving device %s: %w", id, err)
	}
	defer unlock()
	s, ok := m.slot(id)
	if !ok {
		return Slot{}, fmt.Errorf("device %s is no longer offered by this node", id)
	}
	if s.State != record.StateFree || !s.OK || s.Mountpoint == "" {
		// Decided again from the slot as it is now (reserved by a
		// preparation that got its lock first, say).
		return Slot{}, reserve.Retry{Err: fmt.Errorf("device %s (dataset %s) changed while it was being reserved (%s): %w", id, s.Dataset, view.OrDash(s.Why), errChanged)}
	}
	m.mu.Lock()
	want := hostfs.FlagsFor(reconcile.ClassByName(m.cfg, s.Class).SlotProps())
	m.mu.Unlock()
	if err := mounts.CheckMounted(s.Mountpoint, want); err != nil {
		m.updateSlot(id, func(x *Slot) { x.SetHealth(false, err.Error()) })
		return Slot{}, fmt.Errorf("device %s (dataset %s) cannot be reserved: %w", id, s.Dataset, err)
	}
	if s.Armed != "" {
		// Armed by this run: handed over with no zfs command; its owner
		// is recorded behind the Reserve (recordOwner, package armed). Unless
		// the dataset was made again since this view (a Sync, under the
		// slot's lock, before it installed what it made).
		if !m.arm.Claim(s.Dataset, s.Armed) {
			return Slot{}, reserve.Retry{Err: fmt.Errorf("device %s (dataset %s) changed while it was being reserved: %w", id, s.Dataset, errChanged)}
		}
	} else if err := m.zfs.Set(zfs.Foreground(ctx), s.Dataset, record.PropState, string(record.To(record.Reserve))); err != nil {
		// Foreground: the task's start waits for this command.
		m.unmarkFresh(ctx, s)
		return Slot{}, fmt.Errorf("reserving device %s (dataset %s): %w", id, s.Dataset, err)
	}
	m.updateSlot(id, func(x *Slot) { x.State = record.StateReserved; x.Owner, x.Stamped = record.Owner{}, record.Owner{} })
	s.State = record.StateReserved
	return s, nil
}

// unmarkFresh records the dataset of free slot s as free again after its
// `zfs set` of the reserved state failed, under the slot's lock (held by
// the caller). The command may have landed all the same (cut short by its
// deadline after ZFS applied it), and nobody has had the dataset: it is
// still fresh. Unwritten, the mark would make the next read find the slot
// reserved with no owner, kept until no allocation holds it. When ZFS
// refuses this too, the slot stays free here (nobody has had it, so the
// next Reserve may mark it again) and the error is logged; if the mark did
// land, a sync before the next mark finds the slot reserved for no one and
// keeps it, as it would without this step.
func (m *Manager) unmarkFresh(ctx context.Context, s Slot) {
	if err := m.writeBackFree(ctx, s.ID, s.Dataset); err != nil {
		m.log.Error("marking a free dataset reserved failed, and so did marking it free again; if the mark landed, the next sync keeps the dataset until no allocation holds it", "device", s.ID, "dataset", s.Dataset, "error", err)
	}
}

// writeBackFree records dataset, of slot id, free again after a mark of it
// as reserved that failed or that its asker does not get (unmarkFresh,
// package spare's unmark). The caller holds the slot's lock. It runs even when ctx
// has ended (the mark was cut short by the Reserve's deadline), for
// unmarkTimeout at most. On return the slot has a new version, so that a
// Sync that read ZFS before the write-back, and saw the mark, does not
// overwrite the slot with what it read.
func (m *Manager) writeBackFree(ctx context.Context, id, dataset string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unmarkTimeout)
	defer cancel()
	err := m.zfs.Set(wctx, dataset, record.PropState, string(record.To(record.Unmark)))
	m.updateSlot(id, func(*Slot) {}) // a new version: see Sync
	return err
}

// unmarkTimeout bounds writeBackFree, which runs under the slot's lock.
const unmarkTimeout = 15 * time.Second
