package slots

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
)

// remountTimeout bounds one remount of a slot's mountpoint.
const remountTimeout = 30 * time.Second

// prepareFree readies the host side of every healthy free slot before it is
// offered: the mount at its mountpoint carries nosuid and nodev unless the
// class asks otherwise (whatever the ZFS did with the setuid and devices
// properties), and its root directory has the class owner and mode. A slot
// where that fails is marked unhealthy with why. The mount table is read
// once, whatever the number of slots.
func prepareFree(cfg Config, slots []Slot) []error {
	var errs []error
	var table hostfs.Table
	tableErr := error(nil)
	read := false
	for i := range slots {
		s := &slots[i]
		if !s.ok || s.State != StateFree {
			continue
		}
		if !read {
			table, tableErr = hostfs.ReadTable()
			read = true
		}
		c := classByName(cfg, s.Class)
		if err := ensureMount(table, tableErr, s.Mountpoint, hostfs.FlagsFor(c.SlotProps())); err != nil {
			s.setHealth(false, fmt.Sprintf("mount of %s is not safe to offer: %v", s.Dataset, err))
			errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
			continue
		}
		if err := ensureRoot(s.Mountpoint, c.UID, c.GID, c.Mode); err != nil {
			s.setHealth(false, fmt.Sprintf("cannot set owner and mode of %s: %v", s.Mountpoint, err))
			errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
		}
	}
	return errs
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
	ctx, cancel := context.WithTimeout(context.Background(), remountTimeout)
	defer cancel()
	_, err := hostfs.EnsureFlags(ctx, path, want)
	return err
}

// checkMounted verifies, from the kernel's mount table, that a slot's
// mountpoint is a mount with the wanted flags: Reserve never hands over a
// path that is a bare directory (a dataset unmounted behind the plugin's
// back) or a mount without nosuid/nodev.
func checkMounted(path string, want hostfs.Flags) error {
	t, err := hostfs.ReadTable()
	if err != nil {
		return err
	}
	m, ok := t.At(path)
	if !ok {
		return fmt.Errorf("%s: %w", path, hostfs.ErrNotMounted)
	}
	if !m.Satisfies(want) {
		return fmt.Errorf("%s is mounted without %s", path, want)
	}
	return nil
}

// ensureRoot gives the root directory of a free slot the class owner and
// mode, touching it only when they differ.
func ensureRoot(dir string, uid, gid int, mode os.FileMode) error {
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
