package slots

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/spare"
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
		case <-r.Done():
			errs = append(errs, r.Err())
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
func (m *Manager) releasePass(ctx context.Context, since time.Time) ([]*release.Run, error) {
	m.mu.Lock()
	nomad := m.nomad
	m.mu.Unlock()
	if nomad == nil {
		return nil, nil
	}
	// A kicked pass (since is zero) follows the allocations as they
	// change, and leaves a slot with a spare to its next tenant for a
	// while; the others release every slot they may.
	return m.passer.Start(ctx, nomad, since, since.IsZero())
}

// noteTenancy sets the note of slot s (see setNote) only while the slot
// still shows the tenancy s shows: the same dataset, in the same state, of
// the same owner, with no release begun since s was copied (released is
// m.ten's releases then). A pass decides from a copy of the slots taken before
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
	serving := ""
	if !cur.Surplus {
		serving = cur.Spare // it serves while the release runs
	}
	// Foreground: a Reserve of the slot's next tenant may be waiting for
	// the slot's lock, held across this command (see zfs.Foreground).
	state, err := m.fates.Write(zfs.Foreground(ctx), c, cur, s.Owner, serving)
	if err != nil {
		return false, err
	}
	m.updateSlot(s.ID, func(x *Slot) {
		x.State, x.Owner, x.Stamped = state, s.Owner, s.Owner
		x.SetHealth(false, view.ReleasingReason(*x))
		x.InRelease = true
		if serving != "" && x.Spare == serving {
			spare.Promote(x, record.StateFree)
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

// goRelease carries out the release of s in a goroutine of its own,
// starting it first (startReleaseLocked) when start is set, and returns the
// run; when a run for the slot is already going, it returns that one
// instead. Without start, the release carried out is that of the slot's
// old dataset when it has one, else of its dataset. A known asker (the
// allocation whose Reserve found s to release) gets the fresh dataset
// made for it: created reserved, with it as owner. The run ends when the
// release is done, fails (logged at error level, and retried by a later
// pass) or ctx is done. Runs on different slots go side by side.
func (m *Manager) goRelease(ctx context.Context, s Slot, start bool, asker record.Owner) *release.Run {
	// A spare being made (prev) goes first; the release takes its place
	// in m.runs at once, so that it is joined rather than started twice.
	r, prev, joined := m.runs.Release(s.ID)
	if joined {
		return r
	}
	m.runs.Carry(ctx, s.ID, r, "release", func(ctx context.Context) error {
		if prev != nil {
			select {
			case <-prev.Done():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		began := time.Now()
		worked, err := m.release(ctx, r, s, start, asker)
		if worked || (err != nil && !errors.Is(err, context.Canceled)) {
			m.observeRelease(s.Class, err, began)
		}
		if err == nil && asker.Known() {
			// The spare, off the asker's path, once this run is over.
			go func() {
				<-r.Done()
				m.goTend(ctx, s.ID)
			}()
		}
		return err
	})
	return r
}

// release starts (when start is set) and carries out the release of s,
// holding the slot's lock from start to end: what startRelease wrote is
// still what ZFS has when the first steps are decided from it. worked is
// false when there was nothing to release (the slot changed since s was
// read).
func (m *Manager) release(ctx context.Context, r *release.Run, s Slot, start bool, asker record.Owner) (worked bool, err error) {
	unlock, err := m.lockSlot(ctx, s.ID, "release")
	if err != nil {
		return false, fmt.Errorf("releasing %s: %w", s.ID, err)
	}
	name := s.Dataset
	if !start && s.Old != nil {
		name = s.Old.Dataset
	}
	if start {
		begun, err := m.startReleaseLocked(ctx, s)
		if err != nil || !begun {
			unlock()
			return false, err
		}
	}
	cur, ok := m.slot(s.ID)
	if !ok {
		unlock()
		return false, nil
	}
	rs, ok := release.Of(cur, name)
	if !ok {
		unlock()
		return false, nil // released since s was read
	}
	var first []reconcile.Action
	if start {
		first = m.knownRelease(cur, rs, asker) // nil: the first steps are decided from a read
	}
	t := tend{focus: rs.Dataset, first: first, asker: asker, outside: cur.Old != nil && cur.Old.Dataset == rs.Dataset, run: r}
	return true, m.tendSlotLocked(ctx, cur, t, unlock)
}

// yieldToStarts waits, for run r of slot id (what names its next step in
// the log), for the starts under way (starts.Yield.Wait); it returns at once
// when a Reserve has joined r. The caller holds no slot's lock.
func (m *Manager) yieldToStarts(ctx context.Context, id string, r *release.Run, what string) {
	if waited := m.starts.Wait(ctx, r.Hurried()); waited >= time.Millisecond {
		m.log.Trace("yielded to a task's start", "device", id, "before", what, "waited", waited)
	}
}
