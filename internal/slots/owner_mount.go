package slots

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// A reserved slot's dataset mounted, with the class's mount flags, before
// it goes back to its owner (package mounts readies the host side).

// mountForOwner makes sure that the dataset of reserved slot s is mounted,
// with the class's mount flags, before it goes back to its owner (a
// repeated Reserve): a bare directory at the mountpoint would take the
// tenant's writes outside its dataset and quota. It works under the slot's
// lock and returns the slot with its mountpoint.
func (m *Manager) mountForOwner(ctx context.Context, s Slot) (Slot, error) {
	unlock, err := m.lockSlot(ctx, s.ID, "hand back to its owner")
	if err != nil {
		return s, err
	}
	defer unlock()
	return m.mountLocked(ctx, s)
}

// mountLocked is mountForOwner with the slot's lock held by the caller.
func (m *Manager) mountLocked(ctx context.Context, s Slot) (Slot, error) {
	m.mu.Lock()
	c := reconcile.ClassByName(m.cfg, s.Class)
	m.mu.Unlock()
	want := hostfs.FlagsFor(c.SlotProps())
	if s.Mountpoint != "" && mounts.CheckMounted(s.Mountpoint, want) == nil {
		return s, mounts.ReadyRoot(ctx, s.Mountpoint, c)
	}
	ds, err := m.zfs.Get(ctx, s.Dataset, 0, "mounted", "mountpoint")
	if err != nil {
		return s, err
	}
	if len(ds) != 1 {
		return s, fmt.Errorf("reading %s: %d datasets", s.Dataset, len(ds))
	}
	mp, _ := ds[0].Value("mountpoint")
	if !filepath.IsAbs(mp) {
		return s, fmt.Errorf("%s has no mountpoint (mountpoint=%s)", s.Dataset, view.OrDash(mp))
	}
	if mounted, _ := ds[0].Value("mounted"); mounted != "yes" {
		mount := m.zfs.Mount
		if c.Encrypted {
			mount = m.zfs.MountLoadKey // the key may not be loaded (a reboot)
		}
		if err := mount(ctx, s.Dataset); err != nil {
			return s, err
		}
		m.log.Info("mounted a reserved slot before handing it to its owner", "device", s.ID, "dataset", s.Dataset)
	}
	rctx, cancel := context.WithTimeout(ctx, mounts.RemountTimeout)
	defer cancel()
	if _, err := hostfs.EnsureFlags(rctx, mp, want); err != nil {
		return s, err
	}
	if err := mounts.CheckMounted(mp, want); err != nil {
		return s, err
	}
	s.Mountpoint = mp
	m.updateSlot(s.ID, func(x *Slot) { x.Mountpoint = mp })
	return s, mounts.ReadyRoot(ctx, mp, c)
}
