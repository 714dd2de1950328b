package reconcile

// A release's steps: what is left of the release of one slot dataset,
// decided from its recorded state alone (the release runs of package
// slots/release carry them out, and Sync resumes them after a crash).

import (
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ReleaseSteps returns what is left of the release of slot dataset d, and
// when again is set, a fresh dataset under its name once it is renamed.
// archiveUnmounted says that the archive container's mountpoint is none
// (Plan.ArchiveUnmounted).
func ReleaseSteps(cfg Config, c Class, index int, d zfs.Dataset, now time.Time, again, archiveUnmounted bool) []Action {
	var steps []Action
	add := func(a Action) {
		a.Dataset, a.Class, a.Index, a.Chain = d.Name, c.Name, index, d.Name
		steps = append(steps, a)
	}
	// The archive's name carries the release time; a released-at that an
	// earlier version recorded is kept, otherwise the time is now.
	at := now
	if v, ok := d.Local(record.PropReleasedAt); ok {
		if t, err := time.Parse(time.RFC3339, v); err == nil {
			at = t
		}
	}
	if record.Recorded(d) == record.StateReleasing {
		// Written by an earlier version: the fate goes on before the
		// rename, so that nothing follows it.
		add(Action{Kind: SetProp, Prop: record.PropState, Value: string(record.To(record.Upgrade))})
	}
	// Where the rename unmounts (RenameUnmounts) into a container that
	// mounts nothing, the rename is the unmount: it fails as busy as the
	// unmount would while a process holds the dataset, and leaves it
	// unmounted; canmount=noauto before it, so that nothing mounts the
	// archive by itself. Not when d has a mountpoint of its own (set by
	// hand), which a rename keeps and would mount again in the archive.
	//
	// Everywhere else (zfs-fuse refuses to rename a mounted dataset) the
	// release unmounts first, and its unmount is `zfs set canmount=off`
	// (Unmount): libzfs unmounts the dataset (never forced: busy while a
	// process holds it) before it records the property, so one process
	// both unmounts it and keeps it from being mounted again by itself,
	// where `zfs unmount` and `zfs set canmount=noauto` took two (issue
	// 46). A stop in between leaves it unmounted with canmount=on: the
	// next plan sets canmount=off, which mounts nothing, and renames.
	_, own := d.Local("mountpoint")
	cm, _ := d.Value("canmount")
	settled := cm == "noauto" || cm == "off" // an earlier build's release set noauto
	switch mounted, _ := d.Value("mounted"); {
	case cfg.RenameUnmounts && archiveUnmounted && !own:
		if !settled {
			add(Action{Kind: SetProp, Prop: "canmount", Value: "noauto"})
		}
	case mounted == "yes":
		add(Action{Kind: Unmount})
	case !settled:
		add(Action{Kind: SetProp, Prop: "canmount", Value: "off"})
	}
	o, _ := record.RecordedOwner(d) // an owner that does not decode is archived as unknown
	add(Action{Kind: RenameToArchive, Target: record.ArchivedName(cfg.ArchiveDataset(), c.Name, index, o, at)})
	if again && index < c.Slots {
		steps = append(steps, Action{Kind: CreateSlot, Dataset: d.Name, Class: c.Name, Index: index, Props: c.SlotProps(), Chain: d.Name})
	}
	return steps
}
