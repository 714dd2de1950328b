package slots

// What the manager knows of a slot beyond what ZFS shows, which its
// health says: notes on in-use slots, why a tenant started empty (kept in
// package tenancy), that allocation views may miss namespaces. How it is
// laid over each slot's view whenever that is published (setSlotsLocked),
// and the rule that keeps a class schedulable while its slots are
// released, are package view's (view/health.go).

import (
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/tenancy"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// note is what the manager knows of an in-use slot beyond what ZFS says
// (package view: Note).
type note = view.Note

// setNote sets (or, with a zero note, clears) what is known of an in-use
// slot beyond ZFS, and publishes it in the slot's health.
func (m *Manager) setNote(id string, n note) {
	m.tenancy(func(t *tenancy.Record) bool { return t.SetNote(id, n) })
}

// noteLocked sets (or, with a zero note, clears) the note of slot id,
// with m.mu held, and reports whether it changed; the caller publishes
// it (setSlotsLocked).
func (m *Manager) noteLocked(id string, n note) bool { return m.ten.SetNote(id, n) }

// tenancy runs fn on what the manager knows beyond ZFS (m.ten) with m.mu
// held, and publishes the slot list again when fn says so. fn may call
// only the Record's methods (packages fate and spare pass theirs): m.mu
// is not taken twice.
func (m *Manager) tenancy(fn func(t *tenancy.Record) (publish bool)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fn(m.ten) {
		m.setSlotsLocked(append([]Slot(nil), m.slots...))
	}
}

// sinceLocked returns the index of slot s in m.slots while it still
// serves s's dataset and no release of it has begun since released was
// read (m.ten's releases), with m.mu held: a decision made from s, outside the
// lock, still bears on the slot. The slot may otherwise serve a new
// dataset of the same name.
func (m *Manager) sinceLocked(s Slot, released uint64) (int, bool) {
	i, ok := m.byID[s.ID]
	if !ok || m.ten.Releases(s.ID) != released || m.slots[i].Dataset != s.Dataset {
		return 0, false
	}
	return i, true
}

// setEmptyStart records why the tenant of slot id started empty despite
// its class's restore = "best-effort", and publishes it in the slot's
// health description for as long as the tenancy lasts.
func (m *Manager) setEmptyStart(id, why string) {
	m.tenancy(func(t *tenancy.Record) bool { t.SetEmptyStart(id, why); return true })
}

// setIncomplete records why allocation views may miss allocations ("" when
// they do not) and publishes it in every device's health description.
func (m *Manager) setIncomplete(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.incomplete == reason {
		return
	}
	if reason != "" {
		m.log.Warn("the Nomad token may not see every namespace: datasets of allocations it cannot see are never released or handed over", "reason", reason)
	}
	m.incomplete = reason
	m.arm.SetIncomplete(reason != "")
	m.setSlotsLocked(append([]Slot(nil), m.slots...))
}

// oneLine makes a text safe for a health description or a log line
// (view.OneLine).
func oneLine(s string) string { return view.OneLine(s) }
