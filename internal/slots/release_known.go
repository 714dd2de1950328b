package slots

import (
	"context"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
)

// knownRelease returns the first steps of the release of rs, a dataset of
// slot cur whose release this run has just begun, decided without a read
// (release.Known), from what the last full read found of the archive
// container; nil when the plugin is not sure enough.
func (m *Manager) knownRelease(cur, rs Slot, asker record.Owner) []reconcile.Action {
	m.mu.Lock()
	arc, cfg := release.Archive{Ready: m.archiveReady, Unmounted: m.archiveUnmounted}, m.cfg
	m.mu.Unlock()
	return release.Known(cfg, arc, cur, rs, asker)
}

// remake returns the step that makes the name of focus, the slot's old
// dataset, again as its spare once it is renamed (release.Remake).
func (m *Manager) remake(cfg Config, cur Slot, focus string) []reconcile.Action {
	return release.Remake(cfg, cur, focus, unrecordedSlot(cur))
}

// settleKnown installs the outcome of work decided without a read (done,
// all of which succeeded) when it needs no read either (release.Settle).
// It reports whether it did; otherwise the caller reads.
func (m *Manager) settleKnown(cfg Config, cur Slot, t tend, done []reconcile.Action) bool {
	ready, ok := release.Settle(m.log, cfg, cur, t.focus, t.asker.Known(), unrecordedSlot(cur), done, m.arm.TokenOf)
	if !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[cur.ID]
	if !ok {
		return false
	}
	// Onto the current view (the pool's health may have been marked
	// meanwhile): only what this work changed.
	slots := append([]Slot(nil), m.slots...)
	now := &slots[i]
	now.Old, now.Sib = nil, ready.Sib
	now.Spare, now.SpareMount, now.SpareOwn, now.SpareArmed = ready.Spare, ready.SpareMount, ready.SpareOwn, ready.SpareArmed
	m.vers[cur.ID]++
	m.setSlotsLocked(slots)
	return true
}

// releaseSlots is the manager's side of a release pass (release.Slots,
// release.Work).
type releaseSlots struct{ m *Manager }

func (r releaseSlots) Proving(id string) bool   { return r.m.provingNow(id) }
func (r releaseSlots) SetIncomplete(why string) { r.m.setIncomplete(why) }
func (r releaseSlots) HoldFor(s Slot) bool      { return r.m.holdFor(s) }
func (r releaseSlots) Note(s Slot, released uint64, n note) {
	r.m.noteTenancy(s, released, n)
}

func (r releaseSlots) Copy() ([]Slot, map[string]uint64) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return append([]Slot(nil), r.m.slots...), r.m.ten.AllReleases()
}

func (r releaseSlots) Asked() time.Time {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.asked
}

func (r releaseSlots) Release(ctx context.Context, s Slot, start bool) *release.Run {
	return r.m.goRelease(ctx, s, start, record.Owner{})
}

func (r releaseSlots) DisarmFree(ctx context.Context) error { return r.m.disarmFree(ctx) }

func (r releaseSlots) AdoptWithheld(ctx context.Context, v *View, s Slot, d decide.Decision) (Slot, error) {
	return r.m.adoptWithheld(ctx, v, s, d, false)
}

func (r releaseSlots) AdoptArmed(ctx context.Context, s Slot) (bool, string, error) {
	return r.m.adoptArmed(ctx, s)
}
