package slots

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
	// slot's two names (see pair.go).
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
	// predecessor's fate written behind it (handOverSpare). "" when there
	// is none.
	Spare      string
	spareMount string
	spareArmed string // the spare's token when ZFS shows it armed
	// ownMount: Dataset has a mountpoint of its own (set by hand), which
	// a rename keeps; spareOwn the same of Spare. A release unmounts such
	// a dataset before its rename (releaseSteps).
	ownMount, spareOwn bool
	// old is the slot's other dataset while it is on its way to the
	// archive (or to be destroyed) and Dataset serves; nil when none.
	// Reserved, it is the dataset an armed spare was handed over in place
	// of, whose fate is written behind the handover (fateDue).
	old *Slot
	// withheld is the slot's other dataset when an earlier run armed it
	// and may have handed it over (pair.roles): not the spare until
	// adoptWithheld proves that nobody has it; nil when none.
	withheld *Slot
	// present: Dataset exists. sib is what the slot's other name holds.
	present bool
	sib     reconcile.NameKind

	// stamped is the owner as recorded on the dataset.
	stamped record.Owner
	// armed is the token of Dataset when ZFS shows it armed (armed.go).
	armed string
	// ok and why are the slot's health as ZFS shows it; Healthy and
	// HealthDesc add what the manager knows beyond ZFS (see derive).
	ok  bool
	why string
	// unreadable: the dataset's properties did not parse; it is left alone.
	unreadable bool
	// inRelease: unhealthy only because it is being released (sound).
	inRelease bool
	// whyWithheld: why says that the slot's other dataset is withheld
	// (withheldReason), and nothing else.
	whyWithheld bool
}

// setHealth sets the slot's health as ZFS shows it.
func (s *Slot) setHealth(ok bool, why string) {
	s.ok, s.why = ok, why
	s.Healthy, s.HealthDesc = ok, why
	s.inRelease, s.whyWithheld = false, false
}
