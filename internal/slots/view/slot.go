// Package view derives the slot list, each slot's health included, from
// the configuration and one read of ZFS: a pure function (Build), shared
// by the manager's Sync and its work on one slot, and by the operator's
// read-only look (Observe).
package view

import (
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Slot is one device instance as last observed.
type Slot struct {
	ID    string // "<class>-<index>"
	Class string
	Index int
	// Dataset is the slot's dataset that serves (in use, or free and
	// offered), or stands for it (being released, missing): one of the
	// slot's two names (see reconcile.Pair).
	Dataset    string
	Mountpoint string // host path; empty when not mounted
	State      record.State
	Owner      record.Owner // zero while unknown
	Healthy    bool
	HealthDesc string
	// Surplus is true for an in-use slot whose index is at or beyond the
	// configured count: it is kept until released, and offered to no one.
	Surplus bool
	Usage   zfs.Usage
	// RestoredAt is, on a slot Reserve has just restored an archive into,
	// when that data was left (its release, or a live backup's snapshot);
	// zero otherwise. It is not kept with the slot.
	RestoredAt time.Time
	// Origin is the snapshot Dataset was cloned from ("" when it was
	// made empty): a class's source, or an older one (see Class.Source).
	Origin string
	// Spare is the slot's fresh dataset beside the one in use, mounted
	// and ready: the next tenant gets it in memory when it is armed, its
	// predecessor's fate written behind it (spare.Hander.HandOver). "" when there
	// is none.
	Spare string

	// The rest is the slot engine's own (package slots): what it read of
	// the slot beyond the fields above, and what it derived from that.
	// Users of the manager read the fields above.

	// SpareMount is the spare's mountpoint; SpareArmed the spare's token
	// when ZFS shows it armed.
	SpareMount, SpareArmed string
	// OwnMount: Dataset has a mountpoint of its own (set by hand), which
	// a rename keeps; SpareOwn the same of Spare. A release unmounts such
	// a dataset before its rename (reconcile.ReleaseSteps).
	OwnMount, SpareOwn bool
	// Old is the slot's other dataset while it is on its way to the
	// archive (or to be destroyed) and Dataset serves; nil when none.
	// Reserved, it is the dataset an armed spare was handed over in place
	// of, whose fate is written behind the handover (FateDue).
	Old *Slot
	// Withheld is the slot's other dataset when an earlier run armed it
	// and may have handed it over (reconcile.Pair.Roles): not the spare
	// until the manager's adoptWithheld proves that nobody has it; nil
	// when none.
	Withheld *Slot
	// Exists: Dataset exists (Present). Sib is what the slot's other name
	// holds.
	Exists bool
	Sib    reconcile.NameKind

	// Stamped is the owner as recorded on the dataset.
	Stamped record.Owner
	// Armed is the token of Dataset when ZFS shows it armed (package armed).
	Armed string
	// OK and Why are the slot's health as ZFS shows it; Healthy and
	// HealthDesc add what the manager knows beyond ZFS (Known.Derive, health.go).
	OK  bool
	Why string
	// Unreadable: the dataset's properties did not parse; it is left alone.
	Unreadable bool
	// InRelease: unhealthy only because it is being released (sound).
	InRelease bool
	// WhyWithheld: Why says that the slot's other dataset is withheld
	// (WithheldReason), and nothing else.
	WhyWithheld bool
}

// SetHealth sets the slot's health as ZFS shows it.
func (s *Slot) SetHealth(ok bool, why string) {
	s.OK, s.Why = ok, why
	s.Healthy, s.HealthDesc = ok, why
	s.InRelease, s.WhyWithheld = false, false
}

// FateDue reports whether the slot's old dataset waits for its fate, to be
// written behind the handover of the armed spare that serves in its place:
// ZFS still shows it in use by its ended owner.
func (s Slot) FateDue() bool {
	return s.Old != nil && s.Old.State == record.StateReserved
}

// DatasetNames returns the names of the slot's datasets that exist, as
// last observed.
func (s Slot) DatasetNames(cfg reconcile.Config) []string {
	var out []string
	names := cfg.SlotNames(s.Class, s.Index)
	for _, n := range names {
		switch {
		case n == s.Dataset && (s.Exists || s.Unreadable):
		case n != s.Dataset && s.Sib != reconcile.NameAbsent:
		default:
			continue
		}
		out = append(out, n)
	}
	return out
}
