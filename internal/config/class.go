package config

// The validation of one class of the configuration: a per-slot class
// (slots.Class), a shared one (shared.Class), and what both share.

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// validateRetention checks a class's keep and max_age, which apply to the
// archives of a class that archives. A class that archives and leaves
// max_age out gets DefaultMaxAge, so that archives are bounded out of the
// box; max_age = "none" (MaxAgeNone) turns the age limit off.
func validateRetention(name string, cc ClassConfig, cl slots.Class) (retention.Policy, error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	pol := retention.Policy{Keep: retention.DefaultKeep}
	if cl.OnRelease != slots.OnReleaseArchive {
		if cc.Keep != nil || cc.MaxAge != "" {
			return pol, fmt.Errorf("%s: keep and max_age apply to archives, and on_release = %q keeps none", field("keep/max_age"), cl.OnRelease)
		}
		return pol, nil
	}
	if cc.Keep != nil {
		if *cc.Keep < 1 || *cc.Keep > MaxKeep {
			return pol, fmt.Errorf("%s = %d: must be from 1 to %d (on_release = \"destroy\" keeps none)", field("keep"), *cc.Keep, MaxKeep)
		}
		pol.Keep = *cc.Keep
	}
	maxAge := cc.MaxAge
	switch maxAge {
	case MaxAgeNone:
		return pol, nil // no age limit: pol.MaxAge stays 0
	case "":
		maxAge = DefaultMaxAge
	}
	d, err := time.ParseDuration(maxAge)
	if err != nil {
		return pol, fmt.Errorf("%s = %q: not a duration (use a value such as \"168h\", or %q for no age limit)", field("max_age"), cc.MaxAge, MaxAgeNone)
	}
	if d <= 0 {
		return pol, fmt.Errorf("%s = %q: must be greater than zero (use %q for no age limit)", field("max_age"), cc.MaxAge, MaxAgeNone)
	}
	pol.MaxAge = d
	return pol, nil
}

// validateCommon checks what every class has: its name, slots and
// mount_path (defaulted). It returns the mount path.
func validateCommon(name string, cc ClassConfig) (string, error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	if !classNameRE.MatchString(name) {
		return "", fmt.Errorf("class name %q: use lower-case letters, digits and '-', starting with a letter, at most 32 characters", name)
	}
	if cc.Slots < 0 || cc.Slots > MaxSlots {
		return "", fmt.Errorf("%s = %d: must be from 0 to %d", field("slots"), cc.Slots, MaxSlots)
	}
	mp := cc.MountPath
	if mp == "" {
		mp = "/zfs/" + name
	}
	if !path.IsAbs(mp) || path.Clean(mp) != mp || mp == "/" {
		return "", fmt.Errorf("%s = %q: must be an absolute, clean path other than /, such as /zfs/%s", field("mount_path"), cc.MountPath, name)
	}
	return mp, nil
}

// validateShared checks a `shared = true` class. Fields that shape the
// plugin's own datasets are errors there: the plugin never writes the
// operator's dataset.
func validateShared(name string, cc ClassConfig, parent string) (shared.Class, error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	mp, err := validateCommon(name, cc)
	if err != nil {
		return shared.Class{}, err
	}
	sc := shared.Class{Name: name, Dataset: cc.Dataset, Slots: cc.Slots, MountPath: mp, ReadOnly: true}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"quota", cc.Quota != ""},
		{"properties", len(cc.Properties) > 0},
		{"on_release", cc.OnRelease != ""},
		{"restore", cc.Restore != "" && cc.Restore != slots.RestoreOff},
		{"keep", cc.Keep != nil},
		{"max_age", cc.MaxAge != ""},
		{"backup_interval", cc.BackupInterval != ""},
		{"max_restore_lag", cc.MaxRestoreLag != ""},
		{"source", cc.Source != ""},
		{"encryption", cc.Encryption},
	} {
		if f.set {
			return sc, fmt.Errorf("%s: not for a shared class (shared = true): the plugin only reads the operator's dataset, it never sizes, releases or replaces it", field(f.name))
		}
	}
	if cc.Owner != "" && cc.Owner != DefaultOwner || cc.Mode != "" && cc.Mode != DefaultMode {
		return sc, fmt.Errorf("%s: not for a shared class (shared = true): the operator's dataset keeps its own owner and mode", field("owner/mode"))
	}
	if cc.Dataset == "" {
		return sc, fmt.Errorf("%s is required for a shared class: an existing dataset the operator fills, such as \"tank/models\"", field("dataset"))
	}
	if err := zfs.ValidateDatasetName(cc.Dataset); err != nil {
		return sc, fmt.Errorf("%s = %q: %w", field("dataset"), cc.Dataset, err)
	}
	switch {
	case cc.Dataset == parent || strings.HasPrefix(cc.Dataset, parent+"/"):
		return sc, fmt.Errorf("%s = %q: is inside parent_dataset %q, which the plugin owns; a shared dataset is one the operator owns, outside it", field("dataset"), cc.Dataset, parent)
	case strings.HasPrefix(parent, cc.Dataset+"/"):
		return sc, fmt.Errorf("%s = %q: holds parent_dataset %q: every tenant's data would be visible through it", field("dataset"), cc.Dataset, parent)
	}
	if cc.ReadOnly != nil {
		sc.ReadOnly = *cc.ReadOnly
	}
	if !sc.ReadOnly && !cc.AllowSharedWrites {
		return sc, fmt.Errorf("%s = false: tasks holding a shared dataset at once could overwrite each other's files; set allow_shared_writes = true as well to allow it", field("read_only"))
	}
	if cc.AllowSharedWrites && sc.ReadOnly {
		return sc, fmt.Errorf("%s = true with read_only = true: writes are allowed only with read_only = false", field("allow_shared_writes"))
	}
	return sc, nil
}

func validateClass(name string, cc ClassConfig, parent string) (slots.Class, error) {
	cl := slots.Class{Name: name, Slots: cc.Slots, ReadOnly: cc.ReadOnly != nil && *cc.ReadOnly}
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	mp, err := validateCommon(name, cc)
	if err != nil {
		return cl, err
	}
	cl.MountPath = mp
	for _, f := range []struct {
		name string
		set  bool
	}{{"dataset", cc.Dataset != ""}, {"allow_shared_writes", cc.AllowSharedWrites}} {
		if f.set {
			return cl, fmt.Errorf("%s: only for a shared class (shared = true); this class gives each task its own dataset", field(f.name))
		}
	}
	if cc.Quota == "" {
		return cl, fmt.Errorf("%s is required", field("quota"))
	}
	q, err := zfs.ParseSize(cc.Quota)
	if err != nil {
		return cl, fmt.Errorf("%s = %q: %w", field("quota"), cc.Quota, err)
	}
	cl.Quota = q

	owner := cc.Owner
	if owner == "" {
		owner = DefaultOwner
	}
	if cl.UID, cl.GID, err = parseOwner(owner); err != nil {
		return cl, fmt.Errorf("%s = %q: %w", field("owner"), owner, err)
	}
	mode := cc.Mode
	if mode == "" {
		mode = DefaultMode
	}
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o777 {
		return cl, fmt.Errorf("%s = %q: want octal permission bits from 0000 to 0777, such as \"0770\"", field("mode"), mode)
	}
	cl.Mode = os.FileMode(m)

	cl.Encrypted = cc.Encryption
	if cc.Source != "" && cc.Encryption {
		return cl, fmt.Errorf("%s: not with source = %q: a clone has its snapshot's encryption, not a key of its own", field("encryption"), cc.Source)
	}
	if cc.Source != "" {
		if err := validateSource(cc.Source, parent); err != nil {
			return cl, fmt.Errorf("%s = %q: %w", field("source"), cc.Source, err)
		}
		cl.Source = cc.Source
		if cc.OnRelease == slots.OnReleaseArchive {
			return cl, fmt.Errorf("%s = %q: a class with a source does not archive: an archived clone would keep the golden snapshot %s from being destroyed; use on_release = %q (the default with a source)",
				field("on_release"), cc.OnRelease, cc.Source, slots.OnReleaseDestroy)
		}
	}
	switch cc.OnRelease {
	case "":
		cl.OnRelease = DefaultOnRelease
		if cl.Source != "" {
			cl.OnRelease = slots.OnReleaseDestroy
		}
	case slots.OnReleaseArchive, slots.OnReleaseDestroy:
		cl.OnRelease = cc.OnRelease
	default:
		return cl, fmt.Errorf("%s = %q: want %q or %q", field("on_release"), cc.OnRelease, slots.OnReleaseArchive, slots.OnReleaseDestroy)
	}

	switch cc.Restore {
	case "", slots.RestoreOff:
		cl.Restore = slots.RestoreOff
	case slots.RestoreBestEffort, slots.RestoreRequired:
		if cl.OnRelease != slots.OnReleaseArchive {
			return cl, fmt.Errorf("%s = %q: a restore brings back an archive, and on_release = %q keeps none", field("restore"), cc.Restore, cl.OnRelease)
		}
		cl.Restore = cc.Restore
	default:
		return cl, fmt.Errorf("%s = %q: want %q, %q or %q", field("restore"), cc.Restore, slots.RestoreOff, slots.RestoreBestEffort, slots.RestoreRequired)
	}

	cl.Properties = make(map[string]string, len(cc.Properties))
	for k, v := range cc.Properties {
		switch {
		case forbiddenProps[k] != "":
			return cl, fmt.Errorf("%s: %q may not be set: %s", field("properties"), k, forbiddenProps[k])
		case strings.HasPrefix(k, "nomad-device-zfs:"):
			return cl, fmt.Errorf("%s: %q may not be set: the plugin's own properties are reserved", field("properties"), k)
		case !propertyNameRE.MatchString(k):
			return cl, fmt.Errorf("%s: %q is not a valid ZFS property name", field("properties"), k)
		case v == "" || strings.ContainsAny(v, "\x00\n"):
			return cl, fmt.Errorf("%s: %s = %q: value must be non-empty and on one line", field("properties"), k, v)
		}
		cl.Properties[k] = v
	}
	return cl, nil
}

// validateSource checks a class's source: a snapshot (dataset@name) in the
// parent's pool (a clone lives in its origin's pool) and outside the
// parent (the plugin owns everything under it).
func validateSource(src, parent string) error {
	ds, snap, ok := strings.Cut(src, "@")
	if !ok || snap == "" || strings.ContainsAny(snap, "@/# \t\n") {
		return fmt.Errorf("not a snapshot name: want dataset@snapshot, such as \"tank/golden/ci@v42\"")
	}
	if err := zfs.ValidateDatasetName(ds); err != nil {
		return err
	}
	switch {
	case ds == parent || strings.HasPrefix(ds, parent+"/"):
		return fmt.Errorf("is inside parent_dataset %q, which the plugin owns: keep golden datasets outside it", parent)
	case zfs.PoolOf(ds) != zfs.PoolOf(parent):
		return fmt.Errorf("is in pool %q, and parent_dataset %q in pool %q: a clone must be in its snapshot's pool", zfs.PoolOf(ds), parent, zfs.PoolOf(parent))
	}
	return nil
}

// MinBackupInterval bounds backup_interval from below: each live backup is
// a snapshot and a `zfs send` of what changed.
const MinBackupInterval = time.Second

// validateLive checks a class's backup_interval and max_restore_lag, which
// need backup_dir and restore on (max_restore_lag: restore = "required"),
// and returns them (0 for not set).
func validateLive(name string, cc ClassConfig, cl slots.Class, backupDir string) (interval, lag time.Duration, err error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	duration := func(f, v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("%s = %q: not a duration (use a value such as \"5m\")", field(f), v)
		}
		if d < MinBackupInterval {
			return 0, fmt.Errorf("%s = %q: must be at least %s (leave it out for none)", field(f), v, MinBackupInterval)
		}
		return d, nil
	}
	if cc.BackupInterval != "" {
		if cl.Restore != slots.RestoreBestEffort && cl.Restore != slots.RestoreRequired {
			return 0, 0, fmt.Errorf("%s = %q: live backups are restored on another node, and restore = %q restores nothing; set restore = %q or %q",
				field("backup_interval"), cc.BackupInterval, cl.Restore, slots.RestoreBestEffort, slots.RestoreRequired)
		}
		if backupDir == "" {
			return 0, 0, fmt.Errorf("%s = %q: live backups go to backup_dir, and none is set", field("backup_interval"), cc.BackupInterval)
		}
		if interval, err = duration("backup_interval", cc.BackupInterval); err != nil {
			return 0, 0, err
		}
	}
	if cc.MaxRestoreLag != "" {
		if cl.Restore != slots.RestoreRequired {
			return 0, 0, fmt.Errorf("%s = %q: it bounds what a restore = %q takes, and this class has restore = %q (best-effort takes the newest backup of any age)",
				field("max_restore_lag"), cc.MaxRestoreLag, slots.RestoreRequired, cl.Restore)
		}
		if lag, err = duration("max_restore_lag", cc.MaxRestoreLag); err != nil {
			return 0, 0, err
		}
	}
	return interval, lag, nil
}
