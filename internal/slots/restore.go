package slots

import (
	"context"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/restore"
)

// Archives finds the archived data of an identity for a restore, and holds
// it against retention while the restore runs (restore.Archives).
// *retention.Pruner implements it.
type Archives = restore.Archives

// SetArchives sets where Reserve finds archives to restore (nil for none).
// Set it before the manager is first used.
func (m *Manager) SetArchives(a Archives) { m.restorer.SetArchives(a) }

// restores reports whether class c restores archives at Reserve
// (restore.On).
func restores(c Class) bool { return restore.On(c) }

// restoreSlots is the manager's side of a restore (restore.Slots).
type restoreSlots struct{ m *Manager }

func (r restoreSlots) Lock(ctx context.Context, id, what string) (func(), error) {
	return r.m.lockSlot(ctx, id, what)
}
func (r restoreSlots) Slot(id string) (Slot, bool)      { return r.m.slot(id) }
func (r restoreSlots) All() []Slot                      { return r.m.Slots() }
func (r restoreSlots) Update(id string, fn func(*Slot)) { r.m.updateSlot(id, fn) }
func (r restoreSlots) SetIncomplete(why string)         { r.m.setIncomplete(why) }
func (r restoreSlots) Kick()                            { r.m.Kick() }
func (r restoreSlots) MountLocked(ctx context.Context, s Slot) (Slot, error) {
	return r.m.mountLocked(ctx, s)
}

func (r restoreSlots) Config() reconcile.Config {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.cfg
}

func (r restoreSlots) Forget(id string) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	r.m.ten.Restored(id)
}
