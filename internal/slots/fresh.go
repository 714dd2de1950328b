package slots

// Reserve on fresh slots: the one zfs command of each, and who asked.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// identifyGrace is how long Reserve on a fresh slot waits, after its one
// zfs command, for the allocation read that tells who asked. A fresh dataset
// is empty, so it is handed over either way; without the read its owner
// stays unknown and the slot is kept until no allocation holds it.
const identifyGrace = 2 * time.Second

// reserveFresh marks fresh slots reserved (one zfs command each), hands
// over the spares of held slots (handOverSpare: in memory for an armed
// spare, the old dataset's fate behind it), and, while that runs, reads
// who holds them. It returns once the
// slots are reserved and the read is done, or identifyGrace after the zfs
// work when it is not: an identification only counts from a read that
// began after the call arrived and ended before the dataset was handed
// over, when no tenant can have written to it yet. A spare that cannot be
// handed over (the slot changed since it was seen, or ZFS refused) is a
// retryReserve error; the slots handed over before a failure are
// identified all the same.
func (m *Manager) reserveFresh(ctx context.Context, nomad Nomad, ids []string, spares []Slot, arrived time.Time, have *View) ([]Slot, error) {
	if len(ids) == 0 && len(spares) == 0 {
		return nil, nil
	}
	type read struct {
		v   *View
		err error
	}
	got := make(chan read, 1)
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	switch {
	case have != nil:
		got <- read{v: have}
	case nomad == nil:
		got <- read{err: errors.New("no Nomad API configured")}
	default:
		go func() {
			v, err := nomad.View(ictx, arrived)
			got <- read{v, err}
		}()
	}

	var out []Slot
	how := map[string]string{}
	// released: how many releases of each slot may have begun by the end
	// of its handover (a spare's handover begins the old dataset's);
	// another one since, and the read no longer speaks of what serves.
	released := map[string]uint64{}
	// failed: a handover that failed. The slots handed over before it are
	// still identified below, so that the next round, which finds them
	// reserved, gives them back to their owner (the asker) rather than
	// keep them for want of one.
	var failed error
	for _, held := range spares {
		released[held.ID] = m.releasesOf(held.ID) + 1
		s, err := m.handOverSpare(ctx, held, record.Owner{})
		if err != nil {
			failed = retryReserve{fmt.Errorf("device %s: handing over its spare: %w", held.ID, err)}
			break
		}
		out = append(out, s)
		how[s.ID] = "spare"
	}
	for _, id := range ids {
		if failed != nil {
			break
		}
		released[id] = m.releasesOf(id)
		s, err := m.markReserved(ctx, id)
		if err != nil {
			failed = err
			break
		}
		out = append(out, s)
		how[id] = "fresh"
	}
	if len(out) == 0 {
		return nil, failed
	}

	var r read
	grace := time.NewTimer(identifyGrace)
	defer grace.Stop()
	select {
	case r = <-got:
	case <-grace.C:
		r.err = fmt.Errorf("no allocation read within %s", identifyGrace)
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	for i, s := range out {
		var why string
		switch {
		case r.err != nil:
			why = fmt.Sprintf("the node's allocations could not be read when it was reserved (%v)", r.err)
		case !r.v.Complete:
			m.setIncomplete(r.v.Incomplete)
			why = "the token may not see every namespace (see the warning), so the sole visible holder is no proof of who asked"
		default:
			m.setIncomplete(r.v.Incomplete)
			h := r.v.Holders(s.ID)
			switch {
			case len(h) == 1:
				out[i].Owner = h[0].Owner
			case len(h) == 0:
				why = "no allocation holds it in the read made for this Reserve"
			default:
				why = fmt.Sprintf("%d live allocations hold it", len(h))
			}
		}
		if !m.identified(s, released[s.ID], out[i].Owner, why) {
			// Released since it was handed over (its asker ended before
			// the read came back), and perhaps another tenant's since:
			// what the read says belongs to a dataset that no longer
			// serves, and is not recorded on the one that does.
			m.log.Warn("reserved slot changed before the read that identifies its asker came back", "device", s.ID, "dataset", s.Dataset)
			if failed == nil {
				failed = fmt.Errorf("device %s: its dataset %s was released before the read that identifies the asker came back", s.ID, s.Dataset)
			}
			continue
		}
		if why != "" {
			m.log.Warn("reserved slot's owner unknown", "device", s.ID, "reason", why)
		}
		m.log.Info("slot reserved", "device", s.ID, "dataset", s.Dataset, "owner", out[i].Owner.String(), "how", how[s.ID], "took", time.Since(arrived))
	}
	m.Kick() // record owners in the background, off Reserve's path
	for _, s := range out {
		m.goTend(ctx, s.ID) // the spare, for the next tenant
	}
	if failed != nil {
		return nil, failed
	}
	return out, nil
}

// releasesOf returns how many releases of slot id have begun (forgetTenancy).
func (m *Manager) releasesOf(id string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.releases[id]
}

// identified records what the read made for a Reserve says of slot s,
// as reserveFresh handed it over: its owner o (to record on ZFS, and in
// the slot's view), or, when why says it is unknown, a note that keeps the
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
		m.owners[s.ID] = o
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
		return Slot{}, retryReserve{fmt.Errorf("device %s (dataset %s) changed while it was being reserved (%s): %w", id, s.Dataset, view.OrDash(s.Why), errChanged)}
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
			return Slot{}, retryReserve{fmt.Errorf("device %s (dataset %s) changed while it was being reserved: %w", id, s.Dataset, errChanged)}
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
// unmarkSpare). The caller holds the slot's lock. It runs even when ctx
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
