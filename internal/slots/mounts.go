package slots

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// remountTimeout bounds one remount of a slot's mountpoint.
const remountTimeout = 30 * time.Second

// prepareFree readies the host side of every healthy free slot, and every
// spare, before it is offered: the mount at its mountpoint carries nosuid and nodev unless the
// class asks otherwise (whatever the ZFS did with the setuid and devices
// properties), and its root directory has the class owner and mode. A slot
// where that fails is marked unhealthy with why. The mount table is read
// once, whatever the number of slots.
func prepareFree(cfg Config, slots []Slot) []error {
	c := freeChores{cfg: cfg}
	var errs []error
	for i := range slots {
		errs = append(errs, c.prepare(&slots[i])...)
	}
	return errs
}

// freeChores readies slots one at a time (prepareFree) from one read of
// the mount table, made at the first slot that needs it, or before with
// readTable.
type freeChores struct {
	cfg      Config
	table    hostfs.Table
	tableErr error
	read     bool
}

// readTable reads the mount table now, if it has not been read.
func (c *freeChores) readTable() {
	if !c.read {
		c.table, c.tableErr = hostfs.ReadTable()
		c.read = true
	}
}

// prepare readies the host side of s, its spare included, as prepareFree
// says, and updates s: no spare when the spare's fails, unhealthy with why
// when the slot's own fails.
func (c *freeChores) prepare(s *Slot) []error {
	var errs []error
	if s.Spare != "" {
		c.readTable()
		if err := readyFree(c.cfg, c.table, c.tableErr, s.Class, s.SpareMount); err != nil {
			// No spare then: the slot is released the slow way.
			errs = append(errs, fmt.Errorf("spare %s of slot %s: %w", s.Spare, s.ID, err))
			s.Spare, s.SpareMount, s.SpareArmed = "", "", ""
		}
	}
	if !s.OK || s.State != record.StateFree {
		return errs
	}
	c.readTable()
	if err := readyFree(c.cfg, c.table, c.tableErr, s.Class, s.Mountpoint); err != nil {
		s.SetHealth(false, fmt.Sprintf("dataset %s: %v", s.Dataset, err))
		errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
	}
	return errs
}

// readyFree readies the host side of a fresh dataset of class at
// mountpoint, as prepareFree does. The error names the step that failed:
// the mount's flags, or the root directory's owner and mode.
func readyFree(cfg Config, table hostfs.Table, tableErr error, class, mountpoint string) error {
	c := reconcile.ClassByName(cfg, class)
	if err := ensureMount(table, tableErr, mountpoint, hostfs.FlagsFor(c.SlotProps())); err != nil {
		return fmt.Errorf("mount is not safe to offer: %w", err)
	}
	// No caller's context here: the root's look is bounded by rootTimeout.
	if err := ensureRoot(context.Background(), mountpoint, c.UID, c.GID, c.Mode); err != nil {
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

// mountForOwner makes sure that the dataset of reserved slot s is mounted,
// with the class's mount flags, before it goes back to its owner (a
// repeated Reserve): a bare directory at the mountpoint would take the
// tenant's writes outside its dataset and quota. It works under the slot's
// lock and returns the slot with its mountpoint.
func (m *Manager) mountForOwner(ctx context.Context, s Slot) (Slot, error) {
	unlock, err := m.lockSlot(ctx, s.ID, "hand back to its owner")
	if err != nil {
		return s, err
	}
	defer unlock()
	return m.mountLocked(ctx, s)
}

// mountLocked is mountForOwner with the slot's lock held by the caller.
func (m *Manager) mountLocked(ctx context.Context, s Slot) (Slot, error) {
	m.mu.Lock()
	c := reconcile.ClassByName(m.cfg, s.Class)
	m.mu.Unlock()
	want := hostfs.FlagsFor(c.SlotProps())
	if s.Mountpoint != "" && checkMounted(s.Mountpoint, want) == nil {
		return s, readyRoot(ctx, s.Mountpoint, c)
	}
	ds, err := m.zfs.Get(ctx, s.Dataset, 0, "mounted", "mountpoint")
	if err != nil {
		return s, err
	}
	if len(ds) != 1 {
		return s, fmt.Errorf("reading %s: %d datasets", s.Dataset, len(ds))
	}
	mp, _ := ds[0].Value("mountpoint")
	if !filepath.IsAbs(mp) {
		return s, fmt.Errorf("%s has no mountpoint (mountpoint=%s)", s.Dataset, view.OrDash(mp))
	}
	if mounted, _ := ds[0].Value("mounted"); mounted != "yes" {
		mount := m.zfs.Mount
		if c.Encrypted {
			mount = m.zfs.MountLoadKey // the key may not be loaded (a reboot)
		}
		if err := mount(ctx, s.Dataset); err != nil {
			return s, err
		}
		m.log.Info("mounted a reserved slot before handing it to its owner", "device", s.ID, "dataset", s.Dataset)
	}
	rctx, cancel := context.WithTimeout(ctx, remountTimeout)
	defer cancel()
	if _, err := hostfs.EnsureFlags(rctx, mp, want); err != nil {
		return s, err
	}
	if err := checkMounted(mp, want); err != nil {
		return s, err
	}
	s.Mountpoint = mp
	m.updateSlot(s.ID, func(x *Slot) { x.Mountpoint = mp })
	return s, readyRoot(ctx, mp, c)
}

// readyRoot gives an empty root directory the class owner and mode. A
// dataset made for its owner at the end of a release is readied before
// Reserve hands it over, but a plugin stopped in between leaves it as
// `zfs create` made it (root's, 0755): the owner's repeated Reserve readies
// it then. A root with anything in it is the tenant's, and left as it is.
//
// The caller's context bounds it only by its values, not its end: a
// Reserve that ran out of time on another slot still readies the root of
// the one it hands back, and its answer names why it ran out
// (TestSpare_HeldPairHandedOverInPart). rootTimeout bounds it.
func readyRoot(ctx context.Context, dir string, c Class) error {
	ctx = context.WithoutCancel(ctx)
	empty, err := emptyDir(ctx, dir)
	if err != nil || !empty {
		return err
	}
	return ensureRoot(ctx, dir, c.UID, c.GID, c.Mode)
}

// rootTimeout bounds each call into a slot's mounted root directory: on
// zfs-fuse it waits on the daemon, and a daemon that hangs must not hang
// the caller (often a slot's lock holder) with it (hostfs.Do).
var rootTimeout = 10 * time.Second

// inRoot runs op, a call into the root directory dir of a slot's dataset,
// until ctx ends or rootTimeout passes (see hostfs.Get).
func inRoot[T any](ctx context.Context, dir string, op func() (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, rootTimeout)
	defer cancel()
	return hostfs.Get(ctx, dir, op)
}

// ensureRoot gives the root directory of a free slot the class owner and
// mode, touching it only when they differ. It gives up when ctx ends or
// after rootTimeout.
func ensureRoot(ctx context.Context, dir string, uid, gid int, mode os.FileMode) error {
	_, err := inRoot(ctx, dir, func() (struct{}, error) { return struct{}{}, ensureRootNow(dir, uid, gid, mode) })
	return err
}

// ensureRootNow is ensureRoot's work, unbounded: only through inRoot.
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
