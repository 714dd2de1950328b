package slots

// The proof of a prepared slot's asker, made behind its Reserve.
//
// A slot prepared at placement on a dataset armed by this run (package
// prepare)
// is fresh: armed, never handed over, empty. Handing it to the wrong
// asker leaks nothing, so its Reserve answers at once, and the proof that
// the asker is the prepared allocation (Nomad.Holds: one small read of
// that allocation, made after the call arrived) runs behind the answer.
// The proof is about the allocation's state at a moment after the call
// arrived, so it holds however late it comes back (see package prepare).
//
// What a wrong answer could cost is an owner recorded wrongly: the data a
// tenant then writes would follow that owner. So, until the proof
// answers:
//   - no owner is recorded on ZFS: the preparation lays the allocation
//     over the slot's view only (m.ten's unproven askers), and a plugin stopped
//     meanwhile leaves an armed dataset with no owner, which the next run
//     keeps until a complete read and an empty root prove that nobody has
//     it (package armed);
//   - the slot is closed to every other work (its gate, m.proofs):
//     lockSlot waits for the proof, Sync leaves the slot as it is, a
//     release pass does not decide it (the proof kicks the next), no
//     preparation starts for it, and another Reserve of it waits
//     (awaitProofs). Each waits only for the proofs of its own slots, and
//     a proof lasts proofs.After and identifyGrace at most.
//
// A proof that shows the prepared allocation live, wanted running and
// holding the devices makes it the owner, recorded behind as after any
// Reserve. Anything else (the allocation gone or stopping by then, the
// read failing or taking longer than identifyGrace, another allocation
// asking) and the owner is unknown: the slot is kept, unhealthy, until a
// complete read shows no allocation holding it, as a fresh slot whose
// asker was never identified. No later read can name the asker instead: a
// read after the answer shows who holds the device then, not who asked.

import (
	"context"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/proofs"
)

// answerBeforeProof hands over the prepared slots res (of ids, as
// prepare's Reserve checked them, each prepared for asker on a dataset armed
// by this run) at once, and proves the asker behind the answer (see the
// top of this file). In one hold of mu it checks that each slot is still
// as res shows it and closes it to other work until the proof answers;
// it takes no slot's lock, so that it waits for no zfs command (the fate
// of a prepared spare's old dataset, written behind). ok is false, with
// why, when a slot changed.
func (m *Manager) answerBeforeProof(ctx context.Context, nomad Nomad, ids []string, ps []*preps.Prep, res []Slot, asker record.Owner, arrived time.Time) (out []Slot, ok bool, why string) {
	released := map[string]uint64{}
	m.mu.Lock()
	for _, s := range res {
		i, found := m.byID[s.ID]
		if !found {
			m.mu.Unlock()
			return nil, false, "the slot changed since it was prepared"
		}
		cur := m.slots[i]
		unproven := m.ten.Unproven(s.ID)
		if !unproven || cur.State != record.StateReserved || cur.Dataset != s.Dataset || cur.Armed == "" || cur.Stamped.Known() ||
			cur.Owner.AllocID != asker.AllocID || cur.Owner.Task != asker.Task {
			m.mu.Unlock()
			return nil, false, "the slot changed since it was prepared"
		}
	}
	closed := make([]string, 0, len(res))
	for _, s := range res {
		closed = append(closed, s.ID)
		released[s.ID] = m.ten.Releases(s.ID)
	}
	gate := m.proofs.Close(closed)
	m.mu.Unlock()
	// No preparation starts for the slots until the proof answered.
	m.preps.Begin(ids)
	for i, s := range res {
		m.setNote(s.ID, note{})
		m.log.Info("slot reserved", "device", s.ID, "dataset", s.Dataset, "owner", asker.String(), "how", ps[i].How, "prepared", true, "proof", "behind", "took", time.Since(arrived))
	}
	go m.prove(context.WithoutCancel(ctx), nomad, ids, res, asker, released, gate)
	return res, true, ""
}

// prove makes the proof behind the answer of answerBeforeProof: one read
// of asker, made proofs.After from now (after the call arrived, and by
// then most likely after the agent has taken the answer in), bounded by
// identifyGrace (m.proofs.Grace).
// It records what the proof says (proven), then opens the slots' gate.
func (m *Manager) prove(ctx context.Context, nomad Nomad, ids []string, res []Slot, asker record.Owner, released map[string]uint64, gate chan struct{}) {
	time.Sleep(proofs.After)
	began := time.Now()
	hctx, cancel := context.WithTimeout(ctx, m.proofs.Grace())
	err := nomad.Holds(hctx, asker, ids)
	cancel()
	m.proven(res, asker, released, err)
	opened := make([]string, 0, len(res))
	for _, s := range res {
		opened = append(opened, s.ID)
	}
	m.proofs.Open(opened, gate)
	m.preps.End(ids)
	if err != nil {
		m.log.Warn("reserved slot's owner unknown: the proof of its asker failed", "devices", ids, "prepared for", asker.String(), "error", err, "took", time.Since(began))
	} else {
		m.log.Debug("asker of a prepared slot proven", "devices", ids, "owner", asker.String(), "took", time.Since(began))
	}
	m.Kick() // record the owner (or the handover), and let the passes decide the slots
	if err == nil {
		for _, s := range res {
			m.goTend(ctx, s.ID) // the spare, for the next tenant (once the owner is recorded)
		}
	}
}

// proven records what the proof of asker said of the slots res, handed
// over with released releases begun (releasesOf) then: with err nil, asker
// is the owner, to record on ZFS (recordOwner); else the owner is unknown,
// the slot is unhealthy with why and kept until no allocation holds it,
// and what is recorded is that its armed dataset was handed over. Nothing
// can change the slots meanwhile but a release begun before the gate, so
// the check is a guard: a slot that no longer serves that dataset is left
// alone.
func (m *Manager) proven(res []Slot, asker record.Owner, released map[string]uint64, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	slots := append([]Slot(nil), m.slots...)
	for _, s := range res {
		i, ok := m.sinceLocked(s, released[s.ID])
		if !ok || slots[i].State != record.StateReserved || slots[i].Stamped.Known() {
			m.ten.Proven(s.ID)
			continue
		}
		m.ten.Proven(s.ID)
		if err == nil {
			m.ten.SetOwner(s.ID, asker)
			slots[i].Owner = asker
		} else {
			m.ten.SetOwner(s.ID, record.Owner{}) // the handover, owner unknown (recordOwner)
			slots[i].Owner = record.Owner{}
			m.noteLocked(s.ID, note{Unhealthy: true, Text: oneLine(fmt.Sprintf("owner unknown: it was handed over as prepared for %s before the proof of its asker, and the proof failed (%v); its data is kept until no allocation holds it", asker, err))})
		}
		m.vers[s.ID]++
	}
	// A release pass decides the slots from a read begun after now: one
	// begun before the answer may not show the asker.
	if err != nil && time.Now().After(m.asked) {
		m.asked = time.Now()
	}
	m.setSlotsLocked(slots)
}

// awaitProofs waits for the proofs under way on the slots of ids (every
// slot when ids is nil), until ctx is done (proofs.Gates.Await).
func (m *Manager) awaitProofs(ctx context.Context, ids []string) error {
	return m.proofs.Await(ctx, ids)
}

// provingNow reports whether a proof is under way on slot id.
func (m *Manager) provingNow(id string) bool { return m.proofs.Under(id) }
