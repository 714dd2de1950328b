package slots

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reserve"
)

// Reserve is called (through the device plugin) when Nomad starts a task
// that was given these device IDs; it returns the slots in the order of
// their index, whatever order Nomad gave (it comes from a map, so it
// differs between allocations): the task finds the same data at the same
// path after a restore, which gives the archives in the order of the slots
// they came from. All IDs must belong to one class.
//
// A slot is handed over only when that is provably safe:
//   - a fresh slot (free, healthy, mounted: no tenant has written to it)
//     costs no zfs command when this run armed it (package armed), one zfs set
//     otherwise. An allocation read that began after the call
//     arrived, made at the same time, records who asked.
//   - a slot a tenant may have written goes only to its recorded owner,
//     shown as the sole live holder of the device by a read of the node's
//     allocations that began after this call arrived (a repeated Reserve).
//     When the recorded owner has positively ended and the only other
//     holder has not started (the asker), the slot is released first and
//     the asker gets the fresh dataset that replaces it.
//
// Anything else — an owner that is unknown, not ended or not visible, the
// API unreachable, two live holders — keeps the data: Reserve waits until
// ctx is done and then fails with an error that names the slot and why.
// No lock is held while Reserve waits or reads the API.
func (m *Manager) Reserve(ctx context.Context, ids []string) ([]Slot, error) {
	arrived := time.Now()
	// The asker's task is starting: from now on, before this Reserve
	// starts any background run (a release behind a handover, a spare),
	// and again once it is answered.
	m.starts.Begin()
	ids = m.inSlotOrder(ids)
	ps, prepared, release := m.claimPreps(ids)
	defer release()
	if !prepared {
		m.noteAsked(arrived)
	}
	waited := false
	res, err := m.reserver.Reserve(ctx, ids, arrived, &waited, ps, prepared)
	if err == nil {
		m.starts.Begin()
	}
	if o := m.observer(); o != nil {
		outcome := ReserveFresh
		switch {
		case err != nil:
			outcome = ReserveFailed
		case waited:
			outcome = ReserveWaited
		}
		o.ReserveDone(outcome, time.Since(arrived))
	}
	return res, err
}

// noteAsked records that a Reserve arrived at arrived, before it may hand
// over a dataset whose asker a release pass has not seen: see m.asked. A
// Reserve of prepared slots notes it only when it cannot use them (their
// asker is in the view they were prepared from).
func (m *Manager) noteAsked(arrived time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if arrived.After(m.asked) {
		m.asked = arrived
	}
}

// inSlotOrder returns a copy of ids sorted by the index of their slot;
// unknown IDs (which checkIDs refuses) go last, in the order given.
func (m *Manager) inSlotOrder(ids []string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	index := func(id string) int {
		if i, ok := m.byID[id]; ok {
			return m.slots[i].Index
		}
		return math.MaxInt
	}
	out := slices.Clone(ids)
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(index(a), index(b)) })
	return out
}

// checkIDs verifies that every ID names a slot and that all are of one class.
func (m *Manager) checkIDs(ids []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var class, first string
	for _, id := range ids {
		i, ok := m.byID[id]
		if !ok {
			return fmt.Errorf("unknown device ID %q: this node offers %s", id, m.idSummaryLocked())
		}
		if s := m.slots[i]; first == "" {
			class, first = s.Class, id
		} else if s.Class != class {
			return fmt.Errorf("device IDs %q and %q belong to different classes (%s, %s): reserve one class at a time", first, id, class, s.Class)
		}
	}
	return nil
}

// classOf returns the class of the first of ids (all of one class: see
// checkIDs), or a zero Class when there is none.
func (m *Manager) classOf(ids []string) Class {
	if len(ids) == 0 {
		return Class{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[ids[0]]
	if !ok {
		return Class{}
	}
	return reconcile.ClassByName(m.cfg, m.slots[i].Class)
}

// reserveSlots is the manager's side of Reserve's rounds (reserve.Slots,
// reserve.Work).
type reserveSlots struct{ m *Manager }

func (r reserveSlots) Slot(id string) (Slot, bool)           { return r.m.slot(id) }
func (r reserveSlots) CheckIDs(ids []string) error           { return r.m.checkIDs(ids) }
func (r reserveSlots) ClassOf(ids []string) Class            { return r.m.classOf(ids) }
func (r reserveSlots) Changed() <-chan struct{}              { return r.m.Changed() }
func (r reserveSlots) Kick()                                 { r.m.Kick() }
func (r reserveSlots) SetIncomplete(why string)              { r.m.setIncomplete(why) }
func (r reserveSlots) NoteAsked(arrived time.Time)           { r.m.noteAsked(arrived) }
func (r reserveSlots) HeldForNext(s Slot) bool               { return r.m.heldForNext(s) }
func (r reserveSlots) ReleasesOf(id string) uint64           { return r.m.releasesOf(id) }
func (r reserveSlots) SetEmptyStart(id, why string)          { r.m.setEmptyStart(id, why) }
func (r reserveSlots) GoTend(ctx context.Context, id string) { r.m.goTend(ctx, id) }

func (r reserveSlots) Nomad() Nomad {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.nomad
}

func (r reserveSlots) Identified(s Slot, released uint64, o record.Owner, why string) bool {
	return r.m.identified(s, released, o, why)
}

func (r reserveSlots) AwaitProofs(ctx context.Context, ids []string) error {
	return r.m.awaitProofs(ctx, ids)
}

func (r reserveSlots) ReservePrepared(ctx context.Context, nomad Nomad, ids []string, ps []*preps.Prep, arrived time.Time) ([]Slot, bool, string) {
	return r.m.preparer.Reserve(ctx, nomad, ids, ps, arrived)
}

func (r reserveSlots) MarkReserved(ctx context.Context, id string) (Slot, error) {
	return r.m.markReserved(ctx, id)
}

func (r reserveSlots) MountForOwner(ctx context.Context, s Slot) (Slot, error) {
	return r.m.mountForOwner(ctx, s)
}

func (r reserveSlots) AdoptArmed(ctx context.Context, s Slot) (bool, string, error) {
	return r.m.adoptArmed(ctx, s)
}

func (r reserveSlots) AdoptWithheld(ctx context.Context, v *View, s Slot, d decide.Decision) (Slot, error) {
	return r.m.adoptWithheld(ctx, v, s, d, true)
}

func (r reserveSlots) HandOverSpare(ctx context.Context, s Slot, asker record.Owner) (Slot, error) {
	return r.m.spares.HandOver(ctx, s, asker, false)
}

// Release starts the release of s for asker, who waits for it: no yielding
// to other starts.
func (r reserveSlots) Release(ctx context.Context, s Slot, asker record.Owner) reserve.Run {
	run := r.m.goRelease(ctx, s, true, asker)
	run.Hurry()
	return run
}
