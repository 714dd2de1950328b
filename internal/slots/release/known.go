package release

// A release decided from what the manager knows, without reading ZFS
// again: the steps of a slot's release from its view (Known), and the
// check that they landed (Settle).

import (
	"errors"
	"maps"
	"path/filepath"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Archive is what the last full read found of the archive container:
// Ready, the plugin's own; Unmounted, with mountpoint none.
type Archive struct{ Ready, Unmounted bool }

// Known returns the first steps of the release of rs, a dataset of slot
// cur whose release this run has just begun, decided from what the plugin
// knows rather than from a read (see Dataset): down to the rename into the
// archive, then a fresh dataset under its name when the slot has no other
// (the asker's, when asker is known). It returns nil when the plugin is
// not sure enough: the archive container was not confirmed by the last
// full read, the class is no longer configured, the slot's other name
// holds something other than a spare or the dataset in use, or the host's
// mount table does not say plainly whether rs is mounted at its
// mountpoint, or shows it mounted somewhere else too.
func Known(cfg reconcile.Config, arc Archive, cur, rs view.Slot, asker record.Owner) []reconcile.Action {
	c := reconcile.ClassByName(cfg, rs.Class)
	if !arc.Ready || c.Name != rs.Class || rs.Mountpoint == "" {
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
	actions := reconcile.ReleaseSteps(cfg, c, rs.Index, Dataset(rs, mounted), time.Now(), again, arc.Unmounted)
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

// Dataset is slot dataset s (being released) as ZFS has it once its
// release has begun: its fate as its state, its owner, mounted or not, its
// mountpoint when it is its own, and canmount not yet changed. The
// release's first steps are decided from it without reading ZFS again; a
// step that finds ZFS otherwise fails, and the next attempt reads.
func Dataset(s view.Slot, mounted bool) zfs.Dataset {
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

// Of returns the view of slot dataset name while it is released: the
// slot itself, or its old dataset; false when name is not on its way.
func Of(cur view.Slot, name string) (view.Slot, bool) {
	switch {
	case cur.Old != nil && cur.Old.Dataset == name:
		return *cur.Old, true
	case cur.Dataset == name && (cur.State == record.StateReleasing || cur.State == record.StateDestroying):
		return cur, true
	}
	return view.Slot{}, false
}

// Remake returns the step that makes the name of focus, the slot's old
// dataset, again as its spare once it is renamed: when the dataset that
// serves is in use, its handover recorded (unrecorded is false). Nothing
// otherwise.
func Remake(cfg reconcile.Config, cur view.Slot, focus string, unrecorded bool) []reconcile.Action {
	c := reconcile.ClassByName(cfg, cur.Class)
	if cur.Old == nil || cur.Old.Dataset != focus || cur.State != record.StateReserved || cur.Surplus || c.Name != cur.Class || unrecorded {
		return nil
	}
	return []reconcile.Action{{Kind: reconcile.CreateSlot, Dataset: focus, Class: cur.Class, Index: cur.Index, Props: c.SlotProps(), Chain: focus}}
}

// Settle returns the outcome of work decided without a read (done, all
// of which succeeded) when it needs no read either: the old dataset of
// the slot, bound for the archive, renamed there, and the spare made
// under its name (or none needed, the slot serving from a fresh dataset)
// and mounted where the dataset that serves says, as the host's mount
// table shows; the spare readied (mounts.PrepareFree). focus is the
// dataset the work released ("" for none), askerKnown whether it was made
// for an asker, unrecorded whether the slot's handover is not recorded
// yet, tokenOf the armed token of a dataset. It reports whether it did;
// otherwise the caller reads.
func Settle(log hclog.Logger, cfg reconcile.Config, cur view.Slot, focus string, askerKnown, unrecorded bool, done []reconcile.Action, tokenOf func(string) string) (view.Slot, bool) {
	if askerKnown || cur.Mountpoint == "" {
		return view.Slot{}, false
	}
	renamed, made := false, ""
	for _, a := range done {
		switch {
		case a.Kind == reconcile.RenameToArchive && a.Dataset == focus:
			renamed = true
		case a.Kind == reconcile.CreateSlot && a.Dataset != cur.Dataset:
			made = a.Dataset
		}
	}
	x := cur
	if focus != "" {
		if cur.Old == nil || cur.Old.Dataset != focus || cur.Old.State != record.StateReleasing || !renamed {
			return view.Slot{}, false
		}
		x.Old, x.Sib = nil, reconcile.NameAbsent
	}
	switch {
	case made != "":
		_, leaf, _ := view.CutLast(made)
		mp := filepath.Join(filepath.Dir(cur.Mountpoint), leaf)
		table, err := hostfs.ReadTableAt(mp) // the lines at mp alone
		if err != nil {
			return view.Slot{}, false
		}
		if mnt, ok := table.At(mp); !ok || mnt.Source != made {
			return view.Slot{}, false
		}
		x.Spare, x.SpareMount, x.Sib, x.SpareArmed = made, mp, reconcile.NameFresh, tokenOf(made)
	case focus == "" || cur.State != record.StateFree && !unrecorded:
		// Nothing made, or a slot in use left without a spare (but one
		// whose handover is not recorded yet: none is made beside it on
		// purpose, Remake): read.
		return view.Slot{}, false
	}
	ready := []view.Slot{x}
	if errs := mounts.PrepareFree(cfg, ready); len(errs) > 0 {
		log.Warn("spare not readied; the slot's next release waits for one", "device", cur.ID, "error", errors.Join(errs...))
	}
	return ready[0], true
}
