package slots

// A release run: the zfs work of one slot's release, carried out in the
// background (goRelease), one run per slot at a time, that a Reserve of
// the slot can hurry or wait for.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
)

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
	rs, ok := releasingOf(cur, name)
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

// releasingOf returns the view of slot dataset name while it is released:
// the slot itself, or its old dataset; false when name is not on its way.
func releasingOf(cur Slot, name string) (Slot, bool) {
	switch {
	case cur.Old != nil && cur.Old.Dataset == name:
		return *cur.Old, true
	case cur.Dataset == name && (cur.State == record.StateReleasing || cur.State == record.StateDestroying):
		return cur, true
	}
	return Slot{}, false
}

// yieldToStarts waits, for run r of slot id (what names its next step in
// the log), for the starts under way (starts.Yield.Wait); it returns at once
// when a Reserve has joined r. The caller holds no slot's lock.
func (m *Manager) yieldToStarts(ctx context.Context, id string, r *releaseRun, what string) {
	if waited := m.starts.Wait(ctx, r.hurried); waited >= time.Millisecond {
		m.log.Trace("yielded to a task's start", "device", id, "before", what, "waited", waited)
	}
}
