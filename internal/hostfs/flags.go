package hostfs

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotMounted means nothing is mounted at the path: it is missing, or a
// plain directory (possibly inside another mount).
var ErrNotMounted = errors.New("nothing is mounted there")

// ErrFlagsNotApplied means the kernel accepted the remount but the mount
// table read back afterwards still lacks a wanted flag.
var ErrFlagsNotApplied = errors.New("remount did not apply the flags")

// Flags are the per-mount restrictions a slot's mount must carry.
type Flags struct {
	NoSUID bool // exec ignores setuid/setgid bits and file capabilities
	NoDev  bool // device nodes cannot be opened
}

// FlagsFor returns the flags for a class whose ZFS properties are props:
// nosuid unless setuid=on, nodev unless devices=on. It is what every mount
// the plugin makes must carry, whatever the ZFS does with the properties.
func FlagsFor(props map[string]string) Flags {
	return Flags{NoSUID: props["setuid"] != "on", NoDev: props["devices"] != "on"}
}

func (f Flags) String() string {
	var s []string
	if f.NoSUID {
		s = append(s, "nosuid")
	}
	if f.NoDev {
		s = append(s, "nodev")
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// Satisfies reports whether m carries every flag want asks for.
func (m Mount) Satisfies(want Flags) bool {
	return (!want.NoSUID || m.HasOption("nosuid")) && (!want.NoDev || m.HasOption("nodev"))
}

// EnsureFlags makes the mount at path carry the flags want asks for, with a
// bind remount (MS_REMOUNT|MS_BIND) that keeps every per-mount flag it has.
// path must be absolute; it is cleaned, and compared with the mount table as
// the kernel writes it (no symlinks resolved).
//
// On a nil error: a mount is visible at path; it carries nosuid if
// want.NoSUID and nodev if want.NoDev, as read back from the mount table
// after the remount; its other per-mount flags (ro, noexec, the atime mode,
// nosymfollow) are what they were; changed reports whether it remounted.
// It never removes a flag: a false field leaves that flag as it is. Mounts
// made from this one afterwards, such as Nomad's bind mount into a task,
// copy its flags; bind mounts made before are not changed, so call it after
// every mount of a dataset and before the slot is offered.
//
// Errors: ErrNotMounted (nothing changed); ctx's error when ctx ends before
// the remount returns (the remount may still complete later: the path
// lookup can wait on a FUSE daemon), and ErrStuck while such a remount has
// not returned (Do); the kernel's errno, wrapped; or ErrFlagsNotApplied.
// It reads the mount table itself (once, twice when it remounts), since a
// dataset just mounted is newer than any table the caller holds.
func EnsureFlags(ctx context.Context, path string, want Flags) (changed bool, err error) {
	if !filepath.IsAbs(path) {
		return false, fmt.Errorf("ensuring %s on %q: path is not absolute", want, path)
	}
	path = filepath.Clean(path)
	t, err := ReadTable()
	if err != nil {
		return false, err
	}
	m, ok := t.At(path)
	if !ok {
		return false, fmt.Errorf("%s: %w", path, ErrNotMounted)
	}
	if m.Satisfies(want) {
		return false, nil
	}
	flags, err := remountFlags(m, want)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	if err := remount(ctx, path, flags); err != nil {
		return false, fmt.Errorf("remounting %s (%s, was %s) with %s: %w", path, m.FSType, strings.Join(m.Options, ","), want, err)
	}
	if t, err = ReadTable(); err != nil {
		return true, err
	}
	after, ok := t.At(path)
	if !ok {
		return true, fmt.Errorf("%s after remount: %w", path, ErrNotMounted)
	}
	if !after.Satisfies(want) {
		return true, fmt.Errorf("%s: wanted %s, mount table shows %s: %w", path, want, strings.Join(after.Options, ","), ErrFlagsNotApplied)
	}
	return true, nil
}

// remount runs the mount(2) call, giving up waiting when ctx ends. The
// remount itself does not call into the filesystem, but resolving path can
// (a FUSE lookup of the mount point in its parent dataset).
func remount(ctx context.Context, path string, flags uintptr) error {
	return Do(ctx, path, func() error { return unix.Mount("", path, "", flags, "") })
}

// perMount maps each per-mount option the kernel shows (fs/proc_namespace.c
// show_mnt_opts, plus "rw"/"ro") to the mount(2) flag that keeps it on a
// bind remount. A bind remount sets exactly the flags passed, and in a user
// namespace the kernel refuses (EPERM) to clear a locked one, so every flag
// the mount has must be passed again.
var perMount = map[string]uintptr{
	"rw":          0,
	"ro":          unix.MS_RDONLY,
	"nosuid":      unix.MS_NOSUID,
	"nodev":       unix.MS_NODEV,
	"noexec":      unix.MS_NOEXEC,
	"noatime":     unix.MS_NOATIME,
	"nodiratime":  unix.MS_NODIRATIME,
	"relatime":    unix.MS_RELATIME,
	"nosymfollow": unix.MS_NOSYMFOLLOW,
	"idmapped":    0, // not a flag; a remount keeps the idmapping
}

// remountFlags returns the mount(2) flags of a bind remount that keeps every
// per-mount flag m has and adds those want asks for. It is pure. An option
// it does not know is an error rather than a flag silently dropped.
func remountFlags(m Mount, want Flags) (uintptr, error) {
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND)
	for _, o := range m.Options {
		f, ok := perMount[o]
		if !ok {
			return 0, fmt.Errorf("unknown per-mount option %q: a remount would drop it", o)
		}
		flags |= f
	}
	if !m.HasOption("noatime") && !m.HasOption("relatime") {
		// strictatime shows as neither; without the flag a remount
		// would fall back to the default, relatime.
		flags |= unix.MS_STRICTATIME
	}
	if want.NoSUID {
		flags |= unix.MS_NOSUID
	}
	if want.NoDev {
		flags |= unix.MS_NODEV
	}
	return flags, nil
}
