package slots

// A release decided from what the manager knows, without reading ZFS
// again: the steps of a slot's release from its view (knownRelease), and
// the check that they landed (settleKnown).

import (
	"errors"
	"maps"
	"path/filepath"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// knownRelease returns the first steps of the release of rs, a dataset of
// slot cur whose release this run has just begun, decided from what the
// plugin knows rather than from a read (see releasingDataset): down to the
// rename into the archive, then a fresh dataset under its name when the
// slot has no other (the asker's, when asker is known). It returns nil
// when the plugin is not sure enough: the archive container was not
// confirmed by the last full read, the class is no longer configured, the
// slot's other name holds something other than a spare or the dataset in
// use, or the host's mount table does not say plainly whether rs is
// mounted at its mountpoint, or shows it mounted somewhere else too.
func (m *Manager) knownRelease(cur, rs Slot, asker record.Owner) []reconcile.Action {
	m.mu.Lock()
	ready, unmounted, cfg := m.archiveReady, m.archiveUnmounted, m.cfg
	m.mu.Unlock()
	c := reconcile.ClassByName(cfg, rs.Class)
	if !ready || c.Name != rs.Class || rs.Mountpoint == "" {
		return nil
	}
	var again bool
	switch {
	case cur.Dataset == rs.Dataset && cur.Sib == reconcile.NameAbsent:
		again = true
	case cur.Dataset == rs.Dataset && cur.Sib == reconcile.NameFresh:
	case cur.Old != nil && cur.Old.Dataset == rs.Dataset && cur.State == record.StateReserved:
		again = true // the slot's next spare
	case cur.Old != nil && cur.Old.Dataset == rs.Dataset && cur.State == record.StateFree:
	default:
		return nil
	}
	table, err := hostfs.ReadTable()
	if err != nil {
		return nil
	}
	mounted := false
	if mnt, ok := table.At(rs.Mountpoint); ok {
		if mnt.Source != rs.Dataset {
			return nil
		}
		mounted = true
	}
	for _, mnt := range table.Of(rs.Dataset) {
		if mnt.MountPoint != rs.Mountpoint {
			// Mounted where the plugin did not put it: a mountpoint set
			// by hand since the last read, which a rename would keep and
			// mount again. A read decides the steps (unmounted first).
			return nil
		}
	}
	actions := reconcile.ReleaseSteps(cfg, c, rs.Index, releasingDataset(rs, mounted), time.Now(), again, unmounted)
	if asker.Known() {
		for i, a := range actions {
			if a.Kind == reconcile.CreateSlot && a.Dataset == rs.Dataset {
				// Made for the asker: reserved, its owner recorded, in
				// the one command that creates it.
				props := maps.Clone(a.Props)
				props[record.PropState], props[record.PropOwner] = string(record.To(record.Reserve)), asker.Encode()
				actions[i].Props = props
			}
		}
	}
	return actions
}

// releasingDataset is slot dataset s (being released) as ZFS has it once
// its release has begun: its fate as its state, its owner, mounted or not,
// its mountpoint when it is its own, and canmount not yet changed. The
// release's first steps are decided from it without reading ZFS again; a
// step that finds ZFS otherwise fails, and the next attempt reads.
func releasingDataset(s Slot, mounted bool) zfs.Dataset {
	local := func(v string) zfs.Prop { return zfs.Prop{Value: v, Source: "local"} }
	yes := "no"
	if mounted {
		yes = "yes"
	}
	props := map[string]zfs.Prop{
		record.PropManaged: local(record.ManagedSlot),
		record.PropState:   local(string(record.FateOf(s.State))),
		"mounted":          {Value: yes, Source: "-"},
		"canmount":         {Value: "on", Source: "default"},
	}
	if s.Owner.Known() {
		props[record.PropOwner] = local(s.Owner.Encode())
	}
	if s.OwnMount {
		props["mountpoint"] = local(s.Mountpoint)
	}
	return zfs.Dataset{Name: s.Dataset, Props: props}
}

// remake returns the step that makes the name of focus, the slot's old
// dataset, again as its spare once it is renamed: when the dataset that
// serves is in use, its handover recorded (unrecordedSlot). Nothing
// otherwise.
func (m *Manager) remake(cfg Config, cur Slot, focus string) []reconcile.Action {
	c := reconcile.ClassByName(cfg, cur.Class)
	if cur.Old == nil || cur.Old.Dataset != focus || cur.State != record.StateReserved || cur.Surplus || c.Name != cur.Class || unrecordedSlot(cur) {
		return nil
	}
	return []reconcile.Action{{Kind: reconcile.CreateSlot, Dataset: focus, Class: cur.Class, Index: cur.Index, Props: c.SlotProps(), Chain: focus}}
}

// settleKnown installs the outcome of work decided without a read (done,
// all of which succeeded) when it needs no read either: the old dataset
// of the slot, bound for the archive, renamed there, and the spare made
// under its name (or none needed, the slot serving from a fresh dataset)
// and mounted where the dataset that serves says, as the host's mount
// table shows. It reports whether it did; otherwise the caller reads.
func (m *Manager) settleKnown(cfg Config, cur Slot, t tend, done []reconcile.Action) bool {
	if t.asker.Known() || cur.Mountpoint == "" {
		return false
	}
	renamed, made := false, ""
	for _, a := range done {
		switch {
		case a.Kind == reconcile.RenameToArchive && a.Dataset == t.focus:
			renamed = true
		case a.Kind == reconcile.CreateSlot && a.Dataset != cur.Dataset:
			made = a.Dataset
		}
	}
	x := cur
	if t.focus != "" {
		if cur.Old == nil || cur.Old.Dataset != t.focus || cur.Old.State != record.StateReleasing || !renamed {
			return false
		}
		x.Old, x.Sib = nil, reconcile.NameAbsent
	}
	switch {
	case made != "":
		_, leaf, _ := view.CutLast(made)
		mp := filepath.Join(filepath.Dir(cur.Mountpoint), leaf)
		table, err := hostfs.ReadTable()
		if err != nil {
			return false
		}
		if mnt, ok := table.At(mp); !ok || mnt.Source != made {
			return false
		}
		x.Spare, x.SpareMount, x.Sib, x.SpareArmed = made, mp, reconcile.NameFresh, m.arm.TokenOf(made)
	case t.focus == "" || cur.State != record.StateFree && !unrecordedSlot(cur):
		// Nothing made, or a slot in use left without a spare (but one
		// whose handover is not recorded yet: none is made beside it on
		// purpose, remake): read.
		return false
	}
	ready := []Slot{x}
	if errs := mounts.PrepareFree(cfg, ready); len(errs) > 0 {
		m.log.Warn("spare not readied; the slot's next release waits for one", "device", cur.ID, "error", errors.Join(errs...))
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
	now.Old, now.Sib = nil, ready[0].Sib
	now.Spare, now.SpareMount, now.SpareOwn, now.SpareArmed = ready[0].Spare, ready[0].SpareMount, ready[0].SpareOwn, ready[0].SpareArmed
	m.vers[cur.ID]++
	m.setSlotsLocked(slots)
	return true
}
