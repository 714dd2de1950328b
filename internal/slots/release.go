package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ReleaseEnded is one pass of Run (holding back no slot for its next
// tenant: see spareHold) that also waits for the releases it started or
// found running, then records the owners that those held up:
// on return, every slot that could be released has been, and every owner
// identified at Reserve is recorded (or its error is returned).
func (m *Manager) ReleaseEnded(ctx context.Context) error {
	// The proofs behind prepared slots' Reserves first: a pass leaves
	// their slots alone until they answered (proof.go).
	if err := m.awaitProofs(ctx, nil); err != nil {
		return err
	}
	runs, err := m.releasePass(ctx, time.Now())
	// Then the owners identified at Reserve, after the releases have
	// started: a release records its owner itself. What the runs held up
	// (a slot busy, a fate due behind a handover) is tried again once
	// they are over, and that outcome is the one returned.
	owners := m.recordOwners(ctx)
	errs := []error{err}
	for _, r := range runs {
		select {
		case <-r.done:
			errs = append(errs, r.err)
		case <-ctx.Done():
			return errors.Join(append(errs, owners, ctx.Err())...)
		}
	}
	if len(runs) > 0 {
		owners = m.recordOwners(ctx)
	}
	return errors.Join(append(errs, owners)...)
}

// releasePass, from one read of the node's allocations that began after
// since (and after the latest Reserve arrived), starts the release of
// every reserved slot that may be released (decide) and makes sure every
// started release is being carried out. It returns the release runs it
// started or joined, without waiting for them. A slot that may not be
// released is kept, with why in its health: unhealthy when its owner is
// unknown or cannot be verified, or when something holds it that should
// not (conflict). No lock is held while the API is read. It records no
// owner: Run does in a loop of its own, ReleaseEnded after it.
func (m *Manager) releasePass(ctx context.Context, since time.Time) ([]*releaseRun, error) {
	m.mu.Lock()
	nomad := m.nomad
	m.mu.Unlock()
	if nomad == nil {
		return nil, nil
	}
	// A kicked pass (since is zero) follows the allocations as they
	// change, and leaves a slot with a spare to its next tenant for a
	// while; the others release every slot they may.
	return m.startReleases(ctx, nomad, since, since.IsZero())
}

// startReleases is the part of releasePass that reads the API and starts
// the releases. With hold, a slot whose spare is ready is left to its next
// tenant for spareHold after its owner was first found ended (holdFor).
func (m *Manager) startReleases(ctx context.Context, nomad Nomad, since time.Time, hold bool) ([]*releaseRun, error) {
	var errs []error
	// Decisions are made from this copy; a release starts only while the
	// slot still shows the tenancy decided from (startReleaseLocked), and
	// a note is set only while it does (noteTenancy: rel, the releases
	// begun by then, taken with the copy).
	m.mu.Lock()
	slots, rel := append([]Slot(nil), m.slots...), maps.Clone(m.releases)
	m.mu.Unlock()
	var reserved []Slot
	var runs []*releaseRun
	for _, s := range slots {
		switch {
		case s.Unreadable:
			continue
		case m.provingNow(s.ID):
			// Closed until the proof of its asker answered, which
			// kicks the next pass (proof.go).
			continue
		case s.Old != nil || s.State == record.StateReleasing || s.State == record.StateDestroying:
			// Begun: the old dataset first, then the slot's own. Before
			// any read of the API: finishing it needs none.
			runs = append(runs, m.goRelease(ctx, s, false, record.Owner{}))
		}
		if s.State == record.StateReserved {
			reserved = append(reserved, s)
		}
	}
	// Every device's health warns while the token may not see every
	// namespace, whether or not a slot is in use.
	m.setIncomplete(nomad.Incomplete(ctx))
	if m.arm.Incomplete() {
		if err := m.disarmFree(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(reserved) == 0 {
		return runs, errors.Join(errs...)
	}
	m.mu.Lock()
	if since.Before(m.asked) {
		since = m.asked // never older than the latest handover
	}
	m.mu.Unlock()
	began := time.Now()
	v, err := nomad.View(ctx, since)
	if err != nil {
		for _, s := range reserved {
			text := fmt.Sprintf("owner unverified: the node's allocations cannot be read (%v); its data is kept", err)
			if !s.Owner.Known() {
				text = fmt.Sprintf("owner unknown: the allocation it was handed to was never identified, and the node's allocations cannot be read (%v); its data is kept", err)
			}
			m.noteTenancy(s, rel[s.ID], note{Unhealthy: true, Text: text})
		}
		m.log.Warn("cannot read the node's allocations; keeping every in-use dataset", "error", err)
		return runs, errors.Join(errs...)
	}
	m.setIncomplete(v.Incomplete)
	reused := v.Began.Before(began) // read before this pass, not for it
	for _, s := range reserved {
		if reused && !s.Owner.Known() {
			// Its release would rest on no allocation holding the
			// device: only a read made for this pass, under the token
			// and the policies of now, may say so (an earlier read may
			// predate a widened token and miss the holder). The
			// periodic pass reads anew; so does any pass whose read is
			// older than the latest Reserve.
			continue
		}
		d := decide.Decide(ctx, m.log, m.arm, nomad, v, s, false)
		if s, err = m.adoptWithheld(ctx, v, s, d, false); err != nil {
			errs = append(errs, err)
		}
		switch d.Kind {
		case decide.Adopt:
			adopted, why, err := m.adoptArmed(ctx, s)
			switch {
			case err != nil:
				errs = append(errs, err)
			case adopted:
			case len(v.Holders(s.ID)) == 0:
				// Not fresh, and nobody holds it: released as any slot
				// whose owner was never identified.
				m.log.Info("releasing an earlier run's armed dataset that is not known to be fresh; no allocation holds it", "device", s.ID, "reason", why)
				runs = append(runs, m.goRelease(ctx, s, true, record.Owner{}))
			default:
				m.noteTenancy(s, rel[s.ID], note{Unhealthy: true, Text: fmt.Sprintf("owner unknown: armed by an earlier run of the plugin, and not known to be fresh (%s); its data is kept until no allocation holds it", why)})
			}
		case decide.InUse:
			m.noteTenancy(s, rel[s.ID], note{})
		case decide.StartRelease:
			if hold && m.holdFor(s) {
				continue
			}
			m.log.Info("owner ended", "device", s.ID, "owner", s.Owner.String(), "reason", d.Reason)
			runs = append(runs, m.goRelease(ctx, s, true, record.Owner{}))
		default:
			m.noteTenancy(s, rel[s.ID], note{Unhealthy: true, Text: d.Reason})
		}
	}
	return runs, errors.Join(errs...)
}

// noteTenancy sets the note of slot s (see setNote) only while the slot
// still shows the tenancy s shows: the same dataset, in the same state, of
// the same owner, with no release begun since s was copied (released is
// m.releases then). A pass decides from a copy of the slots taken before
// its read of the API; meanwhile a Reserve may have released the dataset
// and handed the slot to another tenant, perhaps under the same name,
// whose health is not the decision's to set or clear.
func (m *Manager) noteTenancy(s Slot, released uint64, n note) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.sinceLocked(s, released)
	if !ok || m.slots[i].State != s.State || m.slots[i].Owner.AllocID != s.Owner.AllocID {
		return
	}
	if m.noteLocked(s.ID, n) {
		m.setSlotsLocked(append([]Slot(nil), m.slots...))
	}
}

// runTimeout bounds one release run.
const runTimeout = 5 * time.Minute

// ownerLockWait bounds how long a release pass waits for a slot's lock to
// record its owner, so that work on one slot does not hold up the pass.
const ownerLockWait = 100 * time.Millisecond

// startReleaseLocked records, under the slot's lock (held by the caller),
// that the release of s has begun: the owner (when not recorded yet) and
// the dataset's fate (archived, or destroying when the class says so), in
// one zfs command where only the state is new. It reports whether it did:
// it does nothing when the slot no longer shows the tenancy s shows
// (sameTenancy). When ZFS refuses
// (a full pool), the slot is kept, unhealthy with why.
func (m *Manager) startReleaseLocked(ctx context.Context, s Slot) (begun bool, err error) {
	cur, ok := m.slot(s.ID)
	if !ok || !sameTenancy(cur, s) {
		// Changed since the decision (released, reserved again, another
		// owner): decide again from a new read.
		return false, nil
	}
	m.mu.Lock()
	c := reconcile.ClassByName(m.cfg, s.Class)
	m.mu.Unlock()
	spare := ""
	if !cur.Surplus {
		spare = cur.Spare // it serves while the release runs
	}
	// Foreground: a Reserve of the slot's next tenant may be waiting for
	// the slot's lock, held across this command (see zfs.Foreground).
	state, err := m.writeFate(zfs.Foreground(ctx), c, cur, s.Owner, spare)
	if err != nil {
		return false, err
	}
	m.updateSlot(s.ID, func(x *Slot) {
		x.State, x.Owner, x.Stamped = state, s.Owner, s.Owner
		x.SetHealth(false, view.ReleasingReason(*x))
		x.InRelease = true
		if spare != "" && x.Spare == spare {
			promoteSpare(x, record.StateFree)
		}
	})
	return true, nil
}

// holdFor reports whether a kicked pass leaves slot s (whose owner has
// ended, decided from a read that showed no other live holder) alone for
// now: its spare is ready, and its owner's end was first seen less than
// the hold ago. A kick is set for the end of the hold, so that the slot
// is released then if no Reserve came for it.
func (m *Manager) holdFor(s Slot) bool {
	if !m.holdable(s) {
		return false
	}
	ok, first := m.holds.Hold(s.ID, s.Owner.AllocID, m.Kick)
	if first {
		m.log.Debug("owner ended; the slot's spare waits for its next tenant", "device", s.ID, "owner", s.Owner.String(), "for", m.holds.Duration())
	}
	return ok
}

// holdable reports whether slot s may be held for its next tenant: its
// spare is ready, it is not surplus, and its class does not restore (the
// replacement of its owner gets the owner's data, not a spare).
func (m *Manager) holdable(s Slot) bool {
	return s.Spare != "" && !s.Surplus && s.OK && !restores(m.classOf([]string{s.ID}))
}

// heldForNext reports whether reserved slot s is held for its next tenant
// (holdFor) now: a release pass found its owner, still the one s shows,
// ended less than the hold ago, from a complete view with no other live
// holder, and the slot still qualifies (a spare ready, not surplus, its
// class not restoring).
func (m *Manager) heldForNext(s Slot) bool {
	if !s.Owner.Known() || !m.holdable(s) {
		return false
	}
	return m.holds.Holding(s.ID, s.Owner.AllocID)
}
