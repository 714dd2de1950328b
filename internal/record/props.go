package record

import "github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"

// User properties the plugin sets. Only datasets that carry PropManaged with
// source "local" are ever changed by the plugin.
const (
	// PropManaged marks a dataset as the plugin's own: ManagedSlot on slot
	// datasets, ManagedClass on the per-class container datasets.
	PropManaged = "nomad-device-zfs:managed"
	// PropState records a slot's state (see State).
	PropState = "nomad-device-zfs:state"
	// PropReleasedAt is when a slot's release began (RFC 3339). It stays
	// on the dataset in the archive, with PropOwner.
	PropReleasedAt = "nomad-device-zfs:released-at"

	ManagedSlot    = "slot"
	ManagedClass   = "class"
	ManagedArchive = "archive"

	// ArchiveName is the container of released datasets, under the parent.
	// Class names cannot start with '.', so it never collides with one.
	ArchiveName = ".archive"
)

// ProbePrefix starts the names of the datasets that SetConfig creates, and
// destroys at once, under the parent to let ZFS judge a class's properties.
// Class names cannot start with '.', so it never collides with one.
const ProbePrefix = ".probe-"

// PropBackup records on an archive the GUID of its snapshot that is in
// backup_dir (package backup), so that it is sent once; BackupNone (a
// restored dataset's) says it is in none: zfs-fuse cannot set a property
// to "".
const (
	PropBackup = "nomad-device-zfs:backup"
	BackupNone = "none"
)

// IsManaged reports whether d carries PropManaged = kind, set locally (not
// inherited): only such a dataset is ever changed by the plugin.
func IsManaged(d zfs.Dataset, kind string) bool {
	v, ok := d.Local(PropManaged)
	return ok && v == kind
}
