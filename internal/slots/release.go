package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ReleaseEnded is one pass of Run (holding back no slot for its next
// tenant: see spareHold) that also waits for the releases it started or
// found running, then records the owners that those held up:
// on return, every slot that could be released has been, and every owner
// identified at Reserve is recorded (or its error is returned).
func (m *Manager) ReleaseEnded(ctx context.Context) error {
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

// ownersPending reports whether an owner identified at Reserve is not
// recorded yet.
func (m *Manager) ownersPending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.owners) > 0
}

// recordOwners records the owners identified at Reserve and not recorded
// yet (recordOwner), leaving those of busy slots for later.
func (m *Manager) recordOwners(ctx context.Context) error {
	m.mu.Lock()
	pending := maps.Clone(m.owners)
	m.mu.Unlock()
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(pending)) {
		if err := m.recordOwner(ctx, id, pending[id]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
		case s.unreadable:
			continue
		case s.old != nil || s.State == record.StateReleasing || s.State == record.StateDestroying:
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
	if m.arm.incomplete.Load() {
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
			m.noteTenancy(s, rel[s.ID], note{unhealthy: true, text: text})
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
		d := m.decide(ctx, nomad, v, s, false)
		if s, err = m.adoptWithheld(ctx, v, s, d, false); err != nil {
			errs = append(errs, err)
		}
		switch d.kind {
		case adopt:
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
				m.noteTenancy(s, rel[s.ID], note{unhealthy: true, text: fmt.Sprintf("owner unknown: armed by an earlier run of the plugin, and not known to be fresh (%s); its data is kept until no allocation holds it", why)})
			}
		case inUse:
			m.noteTenancy(s, rel[s.ID], note{})
		case startRelease:
			if hold && m.holdFor(s) {
				continue
			}
			m.log.Info("owner ended", "device", s.ID, "owner", s.Owner.String(), "reason", d.reason)
			runs = append(runs, m.goRelease(ctx, s, true, record.Owner{}))
		default:
			m.noteTenancy(s, rel[s.ID], note{unhealthy: true, text: d.reason})
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

// releaseRun is work on one slot carried out by a goroutine of its own: a
// release, or the making of its spare (goTend). One runs per slot at a
// time (m.runs).
type releaseRun struct {
	done chan struct{} // closed when the run ends; err is set before
	err  error
	// release: the run releases a dataset (not only makes a spare).
	release bool
	// hurried is closed once a Reserve waits for the run (hurry): it
	// yields to tasks' starts no more (yieldToStarts).
	hurried   chan struct{}
	hurryOnce sync.Once
	// after is the run this one waits for before it begins (a spare
	// being made, which a release goes after); nil for none.
	after *releaseRun
}

// newReleaseRun returns a run not started, to go after prev (nil for none).
func newReleaseRun(release bool, prev *releaseRun) *releaseRun {
	return &releaseRun{done: make(chan struct{}), release: release, hurried: make(chan struct{}), after: prev}
}

// hurry has r, and the run it goes after, stop yielding to tasks' starts:
// a Reserve waits for r. Safe to call more than once.
func (r *releaseRun) hurry() {
	r.hurryOnce.Do(func() { close(r.hurried) })
	if r.after != nil {
		r.after.hurry()
	}
}

// newRun registers a run for slot id, or returns the one registered.
func (m *Manager) newRun(id string, release bool) (r *releaseRun, created bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.runs[id]; ok {
		return r, false
	}
	r = newReleaseRun(release, nil)
	m.runs[id] = r
	return r, true
}

// carry runs fn as run r of slot id in a goroutine of its own. The run
// outlives the caller that started it (a Reserve that gives up, say):
// others may have joined it, and work cut short only costs a retry. Each
// command has its own deadline; runTimeout bounds the waits for the
// slot's lock.
func (m *Manager) carry(ctx context.Context, id string, r *releaseRun, what string, fn func(context.Context) error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runTimeout)
	go func() {
		defer func() {
			cancel()
			m.mu.Lock()
			if m.runs[id] == r {
				delete(m.runs, id)
			}
			m.mu.Unlock()
			close(r.done)
		}()
		r.err = fn(rctx)
		if r.err != nil {
			m.log.Error(what+" incomplete; retried at the next pass", "device", id, "error", r.err)
		}
	}()
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
func (m *Manager) goRelease(ctx context.Context, s Slot, start bool, asker record.Owner) *releaseRun {
	m.mu.Lock()
	prev, ok := m.runs[s.ID]
	if ok && prev.release {
		m.mu.Unlock()
		return prev
	}
	// A spare being made (prev) goes first; the release takes its place
	// in m.runs at once, so that it is joined rather than started twice.
	r := newReleaseRun(true, prev)
	m.runs[s.ID] = r
	m.mu.Unlock()
	m.carry(ctx, s.ID, r, "release", func(ctx context.Context) error {
		if prev != nil {
			select {
			case <-prev.done:
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
				<-r.done
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
func (m *Manager) release(ctx context.Context, r *releaseRun, s Slot, start bool, asker record.Owner) (worked bool, err error) {
	unlock, err := m.lockSlot(ctx, s.ID, "release")
	if err != nil {
		return false, fmt.Errorf("releasing %s: %w", s.ID, err)
	}
	name := s.Dataset
	if !start && s.old != nil {
		name = s.old.Dataset
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
	rs, ok := releasingOf(cur, name)
	if !ok {
		unlock()
		return false, nil // released since s was read
	}
	var first []Action
	if start {
		first = m.knownRelease(cur, rs, asker) // nil: the first steps are decided from a read
	}
	t := tend{focus: rs.Dataset, first: first, asker: asker, outside: cur.old != nil && cur.old.Dataset == rs.Dataset, run: r}
	return true, m.tendSlotLocked(ctx, cur, t, unlock)
}

// releasingOf returns the view of slot dataset name while it is released:
// the slot itself, or its old dataset; false when name is not on its way.
func releasingOf(cur Slot, name string) (Slot, bool) {
	switch {
	case cur.old != nil && cur.old.Dataset == name:
		return *cur.old, true
	case cur.Dataset == name && (cur.State == record.StateReleasing || cur.State == record.StateDestroying):
		return cur, true
	}
	return Slot{}, false
}

// ownerLockWait bounds how long a release pass waits for a slot's lock to
// record its owner, so that work on one slot does not hold up the pass.
const ownerLockWait = 100 * time.Millisecond

// recordOwner writes an owner identified at Reserve on the slot's dataset
// (one zfs command), unless the slot changed since; a zero o records that
// an armed dataset whose owner was never identified was handed over. When other work holds
// the slot, the owner stays pending for the next pass.
func (m *Manager) recordOwner(ctx context.Context, id string, o record.Owner) error {
	if err := m.fateFirst(id); err != nil {
		return fmt.Errorf("recording the owner of %s: %w", id, err)
	}
	lctx, cancel := context.WithTimeout(ctx, ownerLockWait)
	unlock, err := m.lockSlot(lctx, id, "record owner")
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("recording the owner of %s: %w", id, ctx.Err())
		}
		return nil // other work on the slot: still pending, the next pass records it
	}
	defer unlock()
	s, ok := m.slot(id)
	m.mu.Lock()
	cur, pending := m.owners[id]
	m.mu.Unlock()
	if !pending || cur != o {
		// Released and reserved again since o was identified: o belongs to
		// an earlier dataset of this slot.
		return nil
	}
	if !ok || s.State != record.StateReserved || s.stamped.Known() {
		m.dropOwner(id, o)
		return nil
	}
	if s.fateDue() {
		return nil // see fateFirst
	}
	switch {
	case o.Known():
		if err := m.zfs.Set(ctx, s.Dataset, record.PropOwner, o.Encode()); err != nil {
			return fmt.Errorf("recording the owner of %s: %w", id, err)
		}
	case s.armed != "":
		// A handover whose owner was never identified: what is recorded
		// is that the dataset was handed over (armed.go). A dataset not
		// armed says so already.
		if err := m.zfs.Set(ctx, s.Dataset, record.PropState, string(record.To(record.RecordHandover))); err != nil {
			return fmt.Errorf("recording the handover of %s: %w", id, err)
		}
	}
	m.dropOwner(id, o)
	m.updateSlot(id, func(x *Slot) {
		if o.Known() {
			x.Owner, x.stamped = o, o
		}
		x.armed = ""
	})
	m.log.Debug("handover recorded", "device", id, "owner", o.String())
	m.goTend(ctx, id) // the spare, now that its handover is recorded
	return nil
}

// dropOwner forgets the pending owner of slot id once o is recorded (or
// moot), unless another was queued meanwhile: reserveFresh queues the
// handover of an armed spare (a zero owner) before its read tells who
// asked, and the owner that read identifies, queued while the handover
// was written, stays pending for the next pass.
func (m *Manager) dropOwner(id string, o record.Owner) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners[id] == o {
		delete(m.owners, id)
	}
}

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
	c := classByName(m.cfg, s.Class)
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
		x.State, x.Owner, x.stamped = state, s.Owner, s.Owner
		x.setHealth(false, releasingReason(*x))
		x.inRelease = true
		if spare != "" && x.Spare == spare {
			promoteSpare(x, record.StateFree)
		}
	})
	return true, nil
}
