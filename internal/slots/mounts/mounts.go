// Package mounts readies the host side of a slot's dataset: the mount
// at its mountpoint carries nosuid and nodev unless the class asks
// otherwise, and its root directory has the class owner and mode. Every
// look into a mounted root is bounded (RootTimeout).
package mounts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// RemountTimeout bounds one remount of a slot's mountpoint.
const RemountTimeout = 30 * time.Second

// PrepareFree readies the host side of every healthy free slot, and every
// spare, before it is offered: the mount at its mountpoint carries nosuid and nodev unless the
// class asks otherwise (whatever the ZFS did with the setuid and devices
// properties), and its root directory has the class owner and mode. A slot
// where that fails is marked unhealthy with why. The mount table is read
// once, whatever the number of slots.
func PrepareFree(cfg reconcile.Config, slots []view.Slot) []error {
	c := Chores{Cfg: cfg}
	var errs []error
	for i := range slots {
		errs = append(errs, c.Prepare(&slots[i])...)
	}
	return errs
}

// Chores readies slots one at a time (PrepareFree) from one read of
// the mount table, made at the first slot that needs it, or before with
// ReadTable.
type Chores struct {
	Cfg      reconcile.Config
	table    hostfs.Table
	tableErr error
	read     bool
}

// ReadTable reads the mount table now, if it has not been read.
func (c *Chores) ReadTable() {
	if !c.read {
		c.table, c.tableErr = hostfs.ReadTable()
		c.read = true
	}
}

// Prepare readies the host side of s, its spare included, as PrepareFree
// says, and updates s: no spare when the spare's fails, unhealthy with why
// when the slot's own fails.
func (c *Chores) Prepare(s *view.Slot) []error {
	var errs []error
	if s.Spare != "" {
		c.ReadTable()
		if err := ReadyFree(c.Cfg, c.table, c.tableErr, s.Class, s.SpareMount); err != nil {
			// No spare then: the slot is released the slow way.
			errs = append(errs, fmt.Errorf("spare %s of slot %s: %w", s.Spare, s.ID, err))
			s.Spare, s.SpareMount, s.SpareArmed = "", "", ""
		}
	}
	if !s.OK || s.State != record.StateFree {
		return errs
	}
	c.ReadTable()
	if err := ReadyFree(c.Cfg, c.table, c.tableErr, s.Class, s.Mountpoint); err != nil {
		s.SetHealth(false, fmt.Sprintf("dataset %s: %v", s.Dataset, err))
		errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
	}
	return errs
}

// ReadyFree readies the host side of a fresh dataset of class at
// mountpoint, as PrepareFree does. The error names the step that failed:
// the mount's flags, or the root directory's owner and mode.
func ReadyFree(cfg reconcile.Config, table hostfs.Table, tableErr error, class, mountpoint string) error {
	c := reconcile.ClassByName(cfg, class)
	if err := ensureMount(table, tableErr, mountpoint, hostfs.FlagsFor(c.SlotProps())); err != nil {
		return fmt.Errorf("mount is not safe to offer: %w", err)
	}
	// No caller's context here: the root's look is bounded by RootTimeout.
	if err := EnsureRoot(context.Background(), mountpoint, c.UID, c.GID, c.Mode); err != nil {
		return fmt.Errorf("cannot set its root directory's owner and mode: %w", err)
	}
	return nil
}

// ensureMount makes sure something is mounted at path with the wanted
// flags, remounting only when the table says a flag is missing.
func ensureMount(table hostfs.Table, tableErr error, path string, want hostfs.Flags) error {
	if tableErr == nil {
		m, ok := table.At(path)
		if !ok {
			return fmt.Errorf("%s: %w", path, hostfs.ErrNotMounted)
		}
		if m.Satisfies(want) {
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), RemountTimeout)
	defer cancel()
	_, err := hostfs.EnsureFlags(ctx, path, want)
	return err
}

// CheckMounted verifies, from the kernel's mount table, that a slot's
// mountpoint is a mount with the wanted flags: Reserve never hands over a
// path that is a bare directory (a dataset unmounted behind the plugin's
// back) or a mount without nosuid/nodev. It parses only the table's lines
// at path (hostfs.ReadTableAt): a Reserve checks its slot's mount, on a
// node whose table holds a few mounts per allocation.
func CheckMounted(path string, want hostfs.Flags) error {
	_, err := mountedAt(path, want)
	return err
}

// mountedAt is CheckMounted's check, returning the mount it found at path
// (from one read of the table's lines there) when it passes.
func mountedAt(path string, want hostfs.Flags) (hostfs.Mount, error) {
	t, err := hostfs.ReadTableAt(path)
	if err != nil {
		return hostfs.Mount{}, err
	}
	m, ok := t.At(path)
	if !ok {
		return hostfs.Mount{}, fmt.Errorf("%s: %w", path, hostfs.ErrNotMounted)
	}
	if !m.Satisfies(want) {
		return hostfs.Mount{}, fmt.Errorf("%s is mounted without %s", path, want)
	}
	return m, nil
}

// ReadyRoot gives an empty root directory the class owner and mode. A
// dataset made for its owner at the end of a release is readied before
// Reserve hands it over, but a plugin stopped in between leaves it as
// `zfs create` made it (root's, 0755): the owner's repeated Reserve readies
// it then. A root with anything in it is the tenant's, and left as it is.
//
// The caller's context bounds it only by its values, not its end: a
// Reserve that ran out of time on another slot still readies the root of
// the one it hands back, and its answer names why it ran out
// (TestSpare_HeldPairHandedOverInPart). RootTimeout bounds it.
func ReadyRoot(ctx context.Context, dir string, c reconcile.Class) error {
	ctx = context.WithoutCancel(ctx)
	empty, err := EmptyDir(ctx, dir)
	if err != nil || !empty {
		return err
	}
	return EnsureRoot(ctx, dir, c.UID, c.GID, c.Mode)
}

// RootTimeout bounds each call into a slot's mounted root directory: on
// zfs-fuse it waits on the daemon, and a daemon that hangs must not hang
// the caller (often a slot's lock holder) with it (hostfs.Do).
var RootTimeout = 10 * time.Second

// inRoot runs op, a call into the root directory dir of a slot's dataset,
// until ctx ends or RootTimeout passes (see hostfs.Get).
func inRoot[T any](ctx context.Context, dir string, op func() (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, RootTimeout)
	defer cancel()
	return hostfs.Get(ctx, dir, op)
}

// EnsureRoot gives the root directory of a free slot the class owner and
// mode, touching it only when they differ. It gives up when ctx ends or
// after RootTimeout.
func EnsureRoot(ctx context.Context, dir string, uid, gid int, mode os.FileMode) error {
	_, err := inRoot(ctx, dir, func() (struct{}, error) { return struct{}{}, ensureRootNow(dir, uid, gid, mode) })
	return err
}

// ensureRootNow is EnsureRoot's work, unbounded: only through inRoot.
func ensureRootNow(dir string, uid, gid int, mode os.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid || int(st.Gid) != gid {
		if err := os.Lchown(dir, uid, gid); err != nil {
			return err
		}
	}
	if fi.Mode().Perm() != mode.Perm() {
		return os.Chmod(dir, mode.Perm())
	}
	return nil
}

// EmptyDir reports whether directory dir has no entries. It gives up
// when ctx ends, or after RootTimeout (see inRoot).
func EmptyDir(ctx context.Context, dir string) (bool, error) {
	return inRoot(ctx, dir, func() (bool, error) {
		f, err := os.Open(dir)
		if err != nil {
			return false, err
		}
		defer f.Close()
		names, err := f.Readdirnames(1)
		switch {
		case errors.Is(err, io.EOF):
			return true, nil
		case err != nil:
			return false, err
		}
		return len(names) == 0, nil
	})
}

// MayBeWritten says why dataset ds, which should be mounted at mountpoint
// with flags want, may have been written; "" when it cannot have: it is
// what is mounted there, as the plugin mounts it, and its root is empty.
func MayBeWritten(ctx context.Context, ds, mountpoint string, want hostfs.Flags) string {
	// One read of the table decides both: the mount's flags and its source.
	if mnt, err := mountedAt(mountpoint, want); err != nil {
		return err.Error()
	} else if mnt.Source != ds {
		return fmt.Sprintf("%s is not what is mounted at %s", ds, mountpoint)
	}
	empty, err := EmptyDir(ctx, mountpoint)
	switch {
	case err != nil:
		return err.Error()
	case !empty:
		return fmt.Sprintf("%s is not empty: a tenant may have written it", mountpoint)
	}
	return ""
}
