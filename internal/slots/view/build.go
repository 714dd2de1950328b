package view

import (
	"errors"
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

// Build derives the slot list from the configuration and the observed
// datasets. With a non-empty unavailable reason every slot is unhealthy with
// it. failed maps datasets to the reason their last change failed.
func Build(cfg reconcile.Config, datasets []zfs.Dataset, unavailable string, failed map[string]string) []Slot {
	byName := make(map[string]zfs.Dataset, len(datasets))
	for _, d := range datasets {
		byName[d.Name] = d
	}
	Room := poolRoom(cfg, byName)
	var slots []Slot
	for _, c := range cfg.Classes {
		container, containerOK := byName[cfg.ClassDataset(c.Name)]
		max := c.Slots
		// In-use slots beyond the count stay visible until released.
		for _, d := range datasets {
			if parent, idx, ok := CutLast(d.Name); ok && parent == cfg.ClassDataset(c.Name) {
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
			s.Exists, s.Sib = exists, pr.Kinds[1-cur]
			if i >= c.Slots {
				if !exists || d.Err == nil && (!record.IsManaged(d, record.ManagedSlot) || s.State == record.StateFree) {
					continue // a gap, someone else's, or destroyed
				}
				s.Surplus = true
			}
			s.Unreadable = exists && d.Err != nil
			s.SetHealth(health(cfg, c, s, d, exists, container, containerOK, unavailable, failed, Room))
			if why := pr.Conflict(); why != "" && s.OK {
				s.SetHealth(false, "conflict: "+why)
			}
			s.InRelease = !s.OK && s.Why == ReleasingReason(s)
			if spare >= 0 {
				sp := slotFrom(cfg, c, i, pr.Names[spare], pr.DS[spare], true)
				if ok, _ := health(cfg, c, sp, pr.DS[spare], true, container, containerOK, unavailable, failed, Room); ok {
					s.Spare, s.SpareMount, s.SpareOwn, s.SpareArmed = sp.Dataset, sp.Mountpoint, sp.OwnMount, sp.Armed
				}
			}
			if withheld >= 0 {
				w := slotFrom(cfg, c, i, pr.Names[withheld], pr.DS[withheld], true)
				ok, why := health(cfg, c, w, pr.DS[withheld], true, container, containerOK, unavailable, failed, Room)
				if ok {
					s.Withheld, why = &w, ""
				}
				if s.OK {
					s.SetHealth(true, WithheldReason(w.Dataset, why))
					s.WhyWithheld = true
				}
			}
			if old >= 0 {
				o := slotFrom(cfg, c, i, pr.Names[old], pr.DS[old], true)
				s.Old = &o
				if why := failed[o.Dataset]; why != "" && s.OK {
					// Served from the other dataset meanwhile: healthy,
					// and saying why the old one is still there.
					s.SetHealth(true, fmt.Sprintf("the previous dataset %s is kept: %s", o.Dataset, why))
				}
			}
			slots = append(slots, s)
		}
	}
	SortSlots(slots)
	return slots
}

// slotFrom is slot index of class c as dataset d (under name) shows it,
// health aside.
func slotFrom(cfg reconcile.Config, c reconcile.Class, index int, name string, d zfs.Dataset, exists bool) Slot {
	s := Slot{ID: record.DeviceID(c.Name, index), Class: c.Name, Index: index, Dataset: name}
	if !exists || d.Err != nil {
		return s
	}
	s.State = record.Recorded(d)
	if s.State == record.StateArchived {
		s.State = record.StateReleasing // on its way to the archive
	}
	s.Owner, _ = record.RecordedOwner(d)
	s.Stamped = s.Owner
	s.Armed, _ = d.Local(armed.PropArmed)
	_, s.OwnMount = d.Local("mountpoint")
	if mp, ok := d.Value("mountpoint"); ok && filepath.IsAbs(mp) {
		if mounted, _ := d.Value("mounted"); mounted == "yes" {
			s.Mountpoint = mp
		}
	}
	s.Usage = d.Usage()
	s.Origin, _ = d.Value("origin")
	return s
}

// Room is the space the pool can still give the parent's datasets.
type Room struct {
	Known bool
	Bytes uint64
}

// poolRoom reads the parent's "available": what the pool (and any quota on
// the parent) still lets its datasets write.
func poolRoom(cfg reconcile.Config, byName map[string]zfs.Dataset) Room {
	d, ok := byName[cfg.Parent]
	if !ok {
		return Room{}
	}
	return roomOf(d)
}

// ParentRoomOf is poolRoom from a plain read of the datasets.
func ParentRoomOf(parent string, datasets []zfs.Dataset) Room {
	for _, d := range datasets {
		if d.Name == parent {
			return roomOf(d)
		}
	}
	return Room{}
}

// roomOf reads the parent dataset d's "available".
func roomOf(d zfs.Dataset) Room {
	if d.Err != nil {
		return Room{}
	}
	n, err := d.Bytes("available")
	return Room{Known: err == nil, Bytes: n}
}

// SortSlots orders slots by class, then index.
func SortSlots(slots []Slot) {
	sort.SliceStable(slots, func(i, j int) bool {
		if slots[i].Class != slots[j].Class {
			return slots[i].Class < slots[j].Class
		}
		return slots[i].Index < slots[j].Index
	})
}

func health(cfg reconcile.Config, c reconcile.Class, s Slot, d zfs.Dataset, exists bool, container zfs.Dataset, containerOK bool, unavailable string, failed map[string]string, r Room) (bool, string) {
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
		return false, ReleasingReason(s)
	case s.Surplus:
		return false, fmt.Sprintf("slot index %d is beyond slots = %d: removed once released", s.Index, c.Slots)
	case s.Mountpoint == "":
		mounted, _ := d.Value("mounted")
		mp, _ := d.Value("mountpoint")
		return false, fmt.Sprintf("dataset %s is not mounted (mounted=%s, mountpoint=%s)", s.Dataset, OrDash(mounted), OrDash(mp))
	case s.State != record.StateFree && s.State != record.StateReserved:
		return false, fmt.Sprintf("dataset %s has unknown state %q", s.Dataset, s.State)
	case s.State == record.StateFree && r.Known && r.Bytes < c.Quota:
		return false, fmt.Sprintf("pool %s has %s available, less than the class quota %s: a tenant could not use its space", cfg.Pool(), humanBytes(r.Bytes), humanBytes(c.Quota))
	}
	return true, ""
}

// ReleasingReason is the health of a sound slot being released.
func ReleasingReason(s Slot) string {
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

func CutLast(name string) (parent, last string, ok bool) {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			return name[:i], name[i+1:], true
		}
	}
	return "", "", false
}

func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ParentReason is the health of every slot when the parent dataset
// cannot be read (err).
func ParentReason(parent string, err error) string {
	if errors.Is(err, zfs.ErrNotExist) {
		return fmt.Sprintf("parent dataset %s does not exist", parent)
	}
	return fmt.Sprintf("parent dataset %s cannot be read: %v", parent, err)
}

// WithheldReason is the health description of a sound slot whose other
// dataset ds is withheld; unsound says why ds itself is not sound ("" when
// it is), which keeps it from being adopted at all.
func WithheldReason(ds, unsound string) string {
	if unsound != "" {
		return fmt.Sprintf("the slot's other dataset %s, armed by an earlier run of the plugin, is withheld: it may have been handed over, and it is not sound (%s); it is kept until the dataset beside it is released", ds, unsound)
	}
	return fmt.Sprintf("the slot's other dataset %s, armed by an earlier run of the plugin, is withheld: it may have been handed over; it becomes the spare once a read of the allocations shows that nobody has it", ds)
}
