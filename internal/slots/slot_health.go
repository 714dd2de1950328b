package slots

import (
	"fmt"
	"path/filepath"
	"sort"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// This file derives what a slot looks like, health included, from what
// ZFS says of its datasets: a pure function of the configuration and one
// read, shared by Sync and the work on one slot.

// buildSlots derives the slot list from the configuration and the observed
// datasets. With a non-empty unavailable reason every slot is unhealthy with
// it. failed maps datasets to the reason their last change failed.
func buildSlots(cfg Config, datasets []zfs.Dataset, unavailable string, failed map[string]string) []Slot {
	byName := make(map[string]zfs.Dataset, len(datasets))
	for _, d := range datasets {
		byName[d.Name] = d
	}
	room := poolRoom(cfg, byName)
	var slots []Slot
	for _, c := range cfg.Classes {
		container, containerOK := byName[cfg.ClassDataset(c.Name)]
		max := c.Slots
		// In-use slots beyond the count stay visible until released.
		for _, d := range datasets {
			if parent, idx, ok := cutLast(d.Name); ok && parent == cfg.ClassDataset(c.Name) {
				if n, _ := record.SlotIndex(idx); n >= max && (d.Err != nil || record.IsManaged(d, record.ManagedSlot) && record.Recorded(d) != record.StateFree) {
					max = n + 1
				}
			}
		}
		for i := 0; i < max; i++ {
			pr := reconcile.PairOf(cfg, c.Name, i, byName)
			cur, spare, old, withheld := pr.Roles()
			d, exists := pr.DS[cur], pr.Kinds[cur] != reconcile.NameAbsent
			s := slotFrom(cfg, c, i, pr.Names[cur], d, exists)
			s.present, s.sib = exists, pr.Kinds[1-cur]
			if i >= c.Slots {
				if !exists || d.Err == nil && (!record.IsManaged(d, record.ManagedSlot) || s.State == record.StateFree) {
					continue // a gap, someone else's, or destroyed
				}
				s.Surplus = true
			}
			s.unreadable = exists && d.Err != nil
			s.setHealth(health(cfg, c, s, d, exists, container, containerOK, unavailable, failed, room))
			if why := pr.Conflict(); why != "" && s.ok {
				s.setHealth(false, "conflict: "+why)
			}
			s.inRelease = !s.ok && s.why == releasingReason(s)
			if spare >= 0 {
				sp := slotFrom(cfg, c, i, pr.Names[spare], pr.DS[spare], true)
				if ok, _ := health(cfg, c, sp, pr.DS[spare], true, container, containerOK, unavailable, failed, room); ok {
					s.Spare, s.spareMount, s.spareOwn, s.spareArmed = sp.Dataset, sp.Mountpoint, sp.ownMount, sp.armed
				}
			}
			if withheld >= 0 {
				w := slotFrom(cfg, c, i, pr.Names[withheld], pr.DS[withheld], true)
				ok, why := health(cfg, c, w, pr.DS[withheld], true, container, containerOK, unavailable, failed, room)
				if ok {
					s.withheld, why = &w, ""
				}
				if s.ok {
					s.setHealth(true, withheldReason(w.Dataset, why))
					s.whyWithheld = true
				}
			}
			if old >= 0 {
				o := slotFrom(cfg, c, i, pr.Names[old], pr.DS[old], true)
				s.old = &o
				if why := failed[o.Dataset]; why != "" && s.ok {
					// Served from the other dataset meanwhile: healthy,
					// and saying why the old one is still there.
					s.setHealth(true, fmt.Sprintf("the previous dataset %s is kept: %s", o.Dataset, why))
				}
			}
			slots = append(slots, s)
		}
	}
	sortSlots(slots)
	return slots
}

// slotFrom is slot index of class c as dataset d (under name) shows it,
// health aside.
func slotFrom(cfg Config, c Class, index int, name string, d zfs.Dataset, exists bool) Slot {
	s := Slot{ID: record.DeviceID(c.Name, index), Class: c.Name, Index: index, Dataset: name}
	if !exists || d.Err != nil {
		return s
	}
	s.State = record.Recorded(d)
	if s.State == record.StateArchived {
		s.State = record.StateReleasing // on its way to the archive
	}
	s.Owner, _ = record.RecordedOwner(d)
	s.stamped = s.Owner
	s.armed, _ = d.Local(armed.PropArmed)
	_, s.ownMount = d.Local("mountpoint")
	if mp, ok := d.Value("mountpoint"); ok && filepath.IsAbs(mp) {
		if mounted, _ := d.Value("mounted"); mounted == "yes" {
			s.Mountpoint = mp
		}
	}
	s.Usage = d.Usage()
	s.Origin, _ = d.Value("origin")
	return s
}

// room is the space the pool can still give the parent's datasets.
type room struct {
	known bool
	bytes uint64
}

// poolRoom reads the parent's "available": what the pool (and any quota on
// the parent) still lets its datasets write.
func poolRoom(cfg Config, byName map[string]zfs.Dataset) room {
	d, ok := byName[cfg.Parent]
	if !ok {
		return room{}
	}
	return roomOf(d)
}

// parentRoomOf is poolRoom from a plain read of the datasets.
func parentRoomOf(parent string, datasets []zfs.Dataset) room {
	for _, d := range datasets {
		if d.Name == parent {
			return roomOf(d)
		}
	}
	return room{}
}

// roomOf reads the parent dataset d's "available".
func roomOf(d zfs.Dataset) room {
	if d.Err != nil {
		return room{}
	}
	n, err := d.Bytes("available")
	return room{known: err == nil, bytes: n}
}

// sortSlots orders slots by class, then index.
func sortSlots(slots []Slot) {
	sort.SliceStable(slots, func(i, j int) bool {
		if slots[i].Class != slots[j].Class {
			return slots[i].Class < slots[j].Class
		}
		return slots[i].Index < slots[j].Index
	})
}

func health(cfg Config, c Class, s Slot, d zfs.Dataset, exists bool, container zfs.Dataset, containerOK bool, unavailable string, failed map[string]string, r room) (bool, string) {
	switch {
	case unavailable != "":
		return false, unavailable
	case exists && d.Err != nil:
		return false, fmt.Sprintf("properties of %s cannot be read (%v); left alone", s.Dataset, d.Err)
	case failed[s.Dataset] != "":
		return false, failed[s.Dataset]
	case containerOK && container.Err != nil:
		return false, fmt.Sprintf("properties of %s cannot be read (%v); left alone", cfg.ClassDataset(c.Name), container.Err)
	case containerOK && !record.IsManaged(container, record.ManagedClass):
		return false, fmt.Sprintf("dataset %s exists but is not managed by nomad-device-zfs; left alone", cfg.ClassDataset(c.Name))
	case !exists:
		return false, fmt.Sprintf("dataset %s is missing", s.Dataset)
	case !record.IsManaged(d, record.ManagedSlot):
		return false, fmt.Sprintf("dataset %s exists but is not managed by nomad-device-zfs; left alone", s.Dataset)
	case s.State == record.StateReleasing || s.State == record.StateDestroying:
		return false, releasingReason(s)
	case s.Surplus:
		return false, fmt.Sprintf("slot index %d is beyond slots = %d: removed once released", s.Index, c.Slots)
	case s.Mountpoint == "":
		mounted, _ := d.Value("mounted")
		mp, _ := d.Value("mountpoint")
		return false, fmt.Sprintf("dataset %s is not mounted (mounted=%s, mountpoint=%s)", s.Dataset, orDash(mounted), orDash(mp))
	case s.State != record.StateFree && s.State != record.StateReserved:
		return false, fmt.Sprintf("dataset %s has unknown state %q", s.Dataset, s.State)
	case s.State == record.StateFree && r.known && r.bytes < c.Quota:
		return false, fmt.Sprintf("pool %s has %s available, less than the class quota %s: a tenant could not use its space", cfg.Pool(), humanBytes(r.bytes), humanBytes(c.Quota))
	}
	return true, ""
}

// releasingReason is the health of a sound slot being released.
func releasingReason(s Slot) string {
	if s.State != record.StateReleasing && s.State != record.StateDestroying {
		return ""
	}
	return fmt.Sprintf("releasing: %s has ended; its dataset is being %s", s.Owner, map[record.State]string{record.StateReleasing: "archived", record.StateDestroying: "destroyed"}[s.State])
}

// humanBytes prints a byte count in binary units, as ZFS does ("55.0MiB").
func humanBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func cutLast(name string) (parent, last string, ok bool) {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			return name[:i], name[i+1:], true
		}
	}
	return "", "", false
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
