package reconcile

// The configuration the manager works to: the classes, and the names of
// their datasets and devices.

import (
	"os"
	"strconv"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Class is one validated class of the operator's configuration.
type Class struct {
	Name      string
	Slots     int
	Quota     uint64
	MountPath string
	ReadOnly  bool
	UID, GID  int
	Mode      os.FileMode
	// Properties are extra ZFS properties for new datasets; they never hold
	// mountpoint, canmount, quota, refquota or the plugin's own properties.
	Properties map[string]string
	// OnRelease is OnReleaseArchive or OnReleaseDestroy.
	OnRelease string
	// Restore says whether a fresh slot reserved by an allocation whose
	// identity has a local archive gets that archive instead (RestoreOff,
	// RestoreBestEffort, RestoreRequired; "" is RestoreOff).
	Restore string
	// Source is the snapshot (dataset@snap, outside the parent) that fresh
	// datasets are cloned from; "" for empty datasets. A free dataset
	// whose origin is another is made again (see MakePlan).
	Source string
	// Encrypted: each fresh dataset gets its own key (see package keys).
	Encrypted bool
}

// Restore values: what Reserve does when the asker's identity has an
// archive (see package slots/restore).
const (
	RestoreOff        = "off"
	RestoreBestEffort = "best-effort"
	RestoreRequired   = "required"
)

// Config is the validated configuration the manager works to.
type Config struct {
	Parent  string
	Classes []Class // sorted by Name
	// KeyDir holds the keys of encrypted classes' datasets ("" when no
	// class is encrypted).
	KeyDir string
	// RenameUnmounts: this ZFS's `zfs rename` unmounts a mounted
	// filesystem itself and mounts it again only where its new
	// mountpoint lets it (OpenZFS; zfs-fuse refuses to rename a mounted
	// filesystem). Learned by the probe (zfs.Capabilities), never from
	// the configuration. With it, the archive container's mountpoint is
	// none, and a release's rename into it is its unmount too.
	RenameUnmounts bool
}

// Pool returns the pool that holds the parent dataset.
func (c Config) Pool() string { return zfs.PoolOf(c.Parent) }

// ClassDataset returns the container dataset of a class.
func (c Config) ClassDataset(class string) string { return c.Parent + "/" + class }

// SlotDataset returns the dataset of one slot.
func (c Config) SlotDataset(class string, index int) string {
	return c.ClassDataset(class) + "/" + strconv.Itoa(index)
}

// ArchiveDataset returns the container of released datasets.
func (c Config) ArchiveDataset() string { return c.Parent + "/" + record.ArchiveName }

// SlotProps returns the properties a new slot dataset of class c is created
// with: the class properties, setuid=off and devices=off unless the class says
// otherwise, the quota as refquota, and the plugin's marks.
func (c Class) SlotProps() map[string]string {
	props := map[string]string{"setuid": "off", "devices": "off"}
	for k, v := range c.Properties {
		props[k] = v
	}
	props["refquota"] = strconv.FormatUint(c.Quota, 10)
	props[record.PropManaged] = record.ManagedSlot
	props[record.PropState] = string(record.To(record.Create))
	return props
}

// SlotOf returns the device ID a dataset under the parent belongs to: one
// of a slot's own datasets, or one in the archive (its name starts with the
// device ID); "" for anything else.
func (c Config) SlotOf(name string) string {
	rel, ok := strings.CutPrefix(name, c.Parent+"/")
	if !ok {
		return ""
	}
	first, rest, ok := strings.Cut(rel, "/")
	switch {
	case !ok || strings.Contains(rest, "/"):
		return ""
	case first == record.ArchiveName:
		id, _, _ := strings.Cut(rest, ".")
		return id
	}
	if i, _ := record.SlotIndex(rest); i >= 0 {
		return record.DeviceID(first, i)
	}
	return ""
}
