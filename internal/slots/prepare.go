package slots

// Preparation at placement: the manager's side of package prepare (which
// says what a preparation is, when one is made, claimed or voided): the
// work on one slot it has the manager do (prepareFresh, and package
// spare's HandOver), and the preparations a Reserve claims (claimPreps).

import (
	"context"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Prepare is Run's preparation step, for tests and benchmarks: from the
// latest read of the node's allocations, it prepares the slots that read
// shows placed (see package prepare). On return the preparations it
// started are over; an error says why the read could not be used.
func (m *Manager) Prepare(ctx context.Context) error {
	started, err := m.preparer.Prepare(ctx)
	for _, p := range started {
		select {
		case <-p.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// claimPreps marks a Reserve of ids under way (no preparation starts for
// them until release is called) and takes the preparations of ids, in the
// order of ids; ok is false when some id has none. release must be called
// once the Reserve is over.
func (m *Manager) claimPreps(ids []string) (ps []*preps.Prep, ok bool, release func()) {
	return m.preps.Claim(ids)
}

// prepareFresh records free slot s reserved for asker, under the slot's
// lock, after checking that it is still free and mounted as it must be:
// in memory for a dataset armed by this run, else with one zfs command.
// The asker's owner of a dataset not armed is recorded behind it
// (recordOwner), as markReserved and package reserve do for a Reserve; that
// of an armed one only once the proof behind its Reserve shows it
// (proof.go). It returns the dataset and whether it is armed, or
// errChanged when the slot is no longer free.
func (m *Manager) prepareFresh(ctx context.Context, s Slot, asker record.Owner) (ds string, armed bool, err error) {
	unlock, err := m.lockSlot(ctx, s.ID, "prepare")
	if err != nil {
		return "", false, fmt.Errorf("preparing device %s: %w", s.ID, err)
	}
	defer unlock()
	cur, ok := m.slot(s.ID)
	if !ok || cur.State != record.StateFree || !cur.OK || cur.Mountpoint == "" || cur.Dataset != s.Dataset {
		return "", false, errChanged
	}
	m.mu.Lock()
	want := hostfs.FlagsFor(reconcile.ClassByName(m.cfg, cur.Class).SlotProps())
	m.mu.Unlock()
	if err := mounts.CheckMounted(cur.Mountpoint, want); err != nil {
		m.updateSlot(cur.ID, func(x *Slot) { x.SetHealth(false, err.Error()) })
		return "", false, fmt.Errorf("device %s (dataset %s) cannot be prepared: %w", cur.ID, cur.Dataset, err)
	}
	if cur.Armed != "" {
		// Armed by this run: no zfs command (package armed).
		if !m.arm.Claim(cur.Dataset, cur.Armed) {
			return "", false, errChanged // made again since this view
		}
	} else if err := m.zfs.Set(zfs.Foreground(ctx), cur.Dataset, record.PropState, string(record.To(record.Reserve))); err != nil {
		// Foreground: the asker's Reserve may be waiting for it.
		m.unmarkFresh(ctx, cur)
		return "", false, fmt.Errorf("preparing device %s (dataset %s) for %s: %w", cur.ID, cur.Dataset, asker, err)
	}
	m.mu.Lock()
	if cur.Armed != "" {
		m.ten.SetUnproven(cur.ID, asker) // recorded once proven (proof.go)
	} else {
		m.ten.SetOwner(cur.ID, asker)
	}
	m.mu.Unlock()
	m.setNote(cur.ID, note{})
	m.updateSlot(cur.ID, func(x *Slot) { x.State, x.Owner, x.Stamped = record.StateReserved, asker, record.Owner{} })
	if cur.Armed == "" {
		m.Kick() // record the owner, off the asker's path
	}
	return cur.Dataset, cur.Armed != "", nil
}

// prepareSlots is the manager's side of a preparation (prepare.Slots,
// prepare.Work).
type prepareSlots struct{ m *Manager }

func (r prepareSlots) Nomad() Nomad                          { return reserveSlots(r).Nomad() }
func (r prepareSlots) All() []Slot                           { return r.m.Slots() }
func (r prepareSlots) Slot(id string) (Slot, bool)           { return r.m.slot(id) }
func (r prepareSlots) Config() Config                        { return restoreSlots(r).Config() }
func (r prepareSlots) ClassOf(ids []string) Class            { return r.m.classOf(ids) }
func (r prepareSlots) ClearNote(id string)                   { r.m.setNote(id, note{}) }
func (r prepareSlots) GoTend(ctx context.Context, id string) { r.m.goTend(ctx, id) }

func (r prepareSlots) Fresh(ctx context.Context, s Slot, asker record.Owner) (string, bool, error) {
	return r.m.prepareFresh(ctx, s, asker)
}

func (r prepareSlots) Spare(ctx context.Context, s Slot, asker record.Owner) (Slot, error) {
	return r.m.spares.HandOver(ctx, s, asker, true)
}

func (r prepareSlots) RecordOwner(ctx context.Context, id string, asker record.Owner) error {
	return r.m.recordOwner(ctx, id, asker)
}

func (r prepareSlots) AnswerBeforeProof(ctx context.Context, nomad Nomad, ids []string, ps []*preps.Prep, res []Slot, asker record.Owner, arrived time.Time) ([]Slot, bool, string) {
	return r.m.answerBeforeProof(ctx, nomad, ids, ps, res, asker, arrived)
}
