package mounts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
	"golang.org/x/sys/unix"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// tmpfsAt mounts a tmpfs named source at a new directory with flags, and
// unmounts it when the test ends; it returns the directory.
func tmpfsAt(t *testing.T, source string, flags uintptr) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skip(t, "mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	err := unix.Mount(source, dir, "tmpfs", flags, "size=1m")
	if errors.Is(err, unix.EPERM) {
		testenv.Skip(t, "mounting a tmpfs is not permitted here (no CAP_SYS_ADMIN)")
	}
	must.NoError(t, err)
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// CheckMounted and MayBeWritten decide from one read of the kernel's mount
// table, on real mounts: a bare directory is not mounted, a mount without
// a wanted flag is refused by name, and MayBeWritten also wants the dataset
// to be what is mounted there, and its root empty. Their texts are the
// ones the slot's health shows.
func TestCheckMountedAndMayBeWritten(t *testing.T) {
	both := hostfs.Flags{NoSUID: true, NoDev: true}
	cases := []struct {
		name string
		// dir returns the mount point to check.
		dir         func(t *testing.T) string
		source      string // the dataset MayBeWritten is asked about
		wantChecked error  // CheckMounted: nil, or the sentinel it wraps
		checkedText string // CheckMounted's text, when not nil ("%s": the dir)
		writtenText string // MayBeWritten's ("" when it cannot have been written)
	}{
		{name: "mounted as the plugin mounts it, empty", source: "ndz-check",
			dir: func(t *testing.T) string { return tmpfsAt(t, "ndz-check", unix.MS_NOSUID|unix.MS_NODEV) }},
		{name: "a bare directory", source: "ndz-check",
			dir:         func(t *testing.T) string { return t.TempDir() },
			wantChecked: hostfs.ErrNotMounted, checkedText: "%s: " + hostfs.ErrNotMounted.Error(), writtenText: "%s: " + hostfs.ErrNotMounted.Error()},
		{name: "mounted without nodev", source: "ndz-check",
			dir:         func(t *testing.T) string { return tmpfsAt(t, "ndz-check", unix.MS_NOSUID) },
			checkedText: "%s is mounted without nosuid,nodev", writtenText: "%s is mounted without nosuid,nodev"},
		{name: "mounted without nosuid", source: "ndz-check",
			dir:         func(t *testing.T) string { return tmpfsAt(t, "ndz-check", unix.MS_NODEV) },
			checkedText: "%s is mounted without nosuid,nodev", writtenText: "%s is mounted without nosuid,nodev"},
		{name: "another dataset mounted there", source: "pool/nomad/scratch/0",
			dir:         func(t *testing.T) string { return tmpfsAt(t, "ndz-other", unix.MS_NOSUID|unix.MS_NODEV) },
			writtenText: "pool/nomad/scratch/0 is not what is mounted at %s"},
		{name: "written", source: "ndz-check",
			dir: func(t *testing.T) string {
				d := tmpfsAt(t, "ndz-check", unix.MS_NOSUID|unix.MS_NODEV)
				must.NoError(t, os.WriteFile(filepath.Join(d, "data"), []byte("x"), 0o600))
				return d
			},
			writtenText: "%s is not empty: a tenant may have written it"},
	}
	fill := func(text, dir string) string { return strings.ReplaceAll(text, "%s", dir) }
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir(t)
			err := CheckMounted(dir, both)
			if tc.checkedText == "" {
				must.NoError(t, err)
			} else {
				must.EqError(t, err, fill(tc.checkedText, dir))
				if tc.wantChecked != nil {
					must.True(t, errors.Is(err, tc.wantChecked), must.Sprint(err))
				}
			}
			must.Eq(t, fill(tc.writtenText, dir), MayBeWritten(context.Background(), tc.source, dir, both))
		})
	}
}
