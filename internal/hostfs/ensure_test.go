package hostfs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/shoenig/test/must"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

const nobody = 65534

var both = Flags{NoSUID: true, NoDev: true}

// newSlot creates dataset name in a fresh pool with the given properties,
// as the plugin creates a slot, and returns its mountpoint, made reachable
// by user nobody. The pool (and so the dataset) is destroyed at cleanup.
func newSlot(t *testing.T, p *zfstest.Pool, name string, props ...string) string {
	t.Helper()
	args := []string{"create"}
	for _, pr := range props {
		args = append(args, "-o", pr)
	}
	ds := p.Dataset(name)
	p.ZFS(t, append(args, ds)...)
	mp := p.Prop(t, ds, "mountpoint")
	must.NoError(t, os.Chmod(mp, 0o755))
	zfstest.Reachable(t, filepath.Dir(mp))
	return mp
}

// poolFor gives a test its own small pool; it fails the test instead of
// skipping under CI=true, and needs root, as mounting does.
func poolFor(t *testing.T) *zfstest.Pool {
	t.Helper()
	if os.Geteuid() != 0 {
		zfstest.Unavailable(t, "mounting needs root")
	}
	return zfstest.NewPool(t, 256<<20)
}

// setuidRoot copies id(1) into dir as a setuid-root binary, as a root task
// could, and returns its path. `id -u` prints the effective UID.
func setuidRoot(t *testing.T, dir string) string {
	t.Helper()
	src, err := exec.LookPath("id")
	must.NoError(t, err)
	b, err := os.ReadFile(src)
	must.NoError(t, err)
	bin := filepath.Join(dir, "id")
	must.NoError(t, os.WriteFile(bin, b, 0o755))
	must.NoError(t, os.Chown(bin, 0, 0))
	must.NoError(t, os.Chmod(bin, os.ModeSetuid|0o755))
	fi, err := os.Stat(bin)
	must.NoError(t, err)
	must.True(t, fi.Mode()&os.ModeSetuid != 0, must.Sprint("the filesystem kept the setuid bit"))
	return bin
}

// euidAsNobody runs bin -u as user nobody and returns the effective UID it
// printed.
func euidAsNobody(t *testing.T, bin string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
	out, err := cmd.Output()
	must.NoError(t, err, must.Sprintf("running %s as nobody", bin))
	euid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	must.NoError(t, err)
	return euid
}

// nullDevice makes a character device node (1:3, like /dev/null) in dir and
// returns its path.
func nullDevice(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "null")
	must.NoError(t, unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must.NoError(t, os.Chmod(p, 0o666))
	return p
}

// openDevice opens the device node for writing and closes it.
func openDevice(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// bindMount bind-mounts src on a new temp directory, as Nomad mounts a
// device into a task, and unmounts it at cleanup (before the pool, which
// was created earlier, is destroyed).
func bindMount(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	zfstest.Reachable(t, dst)
	must.NoError(t, unix.Mount(src, dst, "", unix.MS_BIND, ""))
	t.Cleanup(func() {
		if err := unix.Unmount(dst, 0); err != nil {
			t.Logf("unmount %s: %v; detaching", dst, err)
			if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
				t.Errorf("detach %s: %v", dst, err)
			}
		}
	})
	return dst
}

func mountAt(t *testing.T, path string) Mount {
	t.Helper()
	tbl, err := ReadTable()
	must.NoError(t, err)
	m, ok := tbl.At(path)
	must.True(t, ok, must.Sprintf("nothing mounted at %s", path))
	return m
}

func without(opts []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(opts), func(o string) bool { return slices.Contains(drop, o) })
}

// The fault and the fix: on zfs-fuse a dataset created with setuid=off
// devices=off is mounted without nosuid/nodev, so a setuid-root binary that
// a root task left in it makes any host user root. After EnsureFlags the
// host mount and a bind mount made from it (Nomad's) carry both flags.
func TestEnsureFlags_StopsSetuidRoot(t *testing.T) {
	p := poolFor(t)
	mp := newSlot(t, p, "slot", "setuid=off", "devices=off")
	must.Eq(t, "off", p.Prop(t, p.Dataset("slot"), "setuid"))
	bin := setuidRoot(t, mp)
	dev := nullDevice(t, mp)

	before := mountAt(t, mp)
	t.Logf("before: %s %s - %s %s", mp, strings.Join(before.Options, ","), before.FSType, before.Source)
	if before.HasOption("nosuid") {
		t.Logf("this ZFS (%s) honours setuid=off: not asserting the fault", before.FSType)
	} else {
		must.Eq(t, 0, euidAsNobody(t, bin), must.Sprint("the fault: nobody runs the slot's setuid binary as root"))
	}
	if !before.HasOption("nodev") {
		must.NoError(t, openDevice(dev), must.Sprint("the fault: the slot's device node opens"))
	}

	changed, err := EnsureFlags(context.Background(), mp, both)
	must.NoError(t, err)

	after := mountAt(t, mp)
	t.Logf("after:  %s %s - %s %s", mp, strings.Join(after.Options, ","), after.FSType, after.Source)
	must.True(t, after.HasOption("nosuid"))
	must.True(t, after.HasOption("nodev"))
	must.Eq(t, without(before.Options, "nosuid", "nodev"), without(after.Options, "nosuid", "nodev"))
	must.Eq(t, before.ID, after.ID, must.Sprint("the same mount, remounted"))
	must.Eq(t, nobody, euidAsNobody(t, bin))
	must.ErrorIs(t, openDevice(dev), fs.ErrPermission)
	must.Eq(t, !before.Satisfies(both), changed)

	// Nomad's bind mount of the host mountpoint into the task copies them.
	bind := bindMount(t, mp)
	bm := mountAt(t, bind)
	t.Logf("bind:   %s %s - %s %s", bind, strings.Join(bm.Options, ","), bm.FSType, bm.Source)
	must.True(t, bm.Satisfies(both))
	must.Eq(t, nobody, euidAsNobody(t, filepath.Join(bind, "id")))
	must.ErrorIs(t, openDevice(filepath.Join(bind, "null")), fs.ErrPermission)

	changed, err = EnsureFlags(context.Background(), mp, both)
	must.NoError(t, err)
	must.False(t, changed, must.Sprint("second call changes nothing"))
	changed, err = EnsureFlags(context.Background(), mp+"/", both)
	must.NoError(t, err)
	must.False(t, changed, must.Sprint("the path is cleaned"))
}

// Why the order matters: a bind mount made before EnsureFlags keeps the
// flags it was made with.
func TestEnsureFlags_EarlierBindUnchanged(t *testing.T) {
	p := poolFor(t)
	mp := newSlot(t, p, "slot", "setuid=off", "devices=off")
	if m := mountAt(t, mp); m.HasOption("nosuid") {
		// This ZFS applies setuid=off to the mount itself: no earlier bind
		// can lack the flag. That is the property this test is about.
		must.True(t, mountAt(t, bindMount(t, mp)).HasOption("nosuid"))
		return
	}
	bin := setuidRoot(t, mp)
	early := bindMount(t, mp)

	_, err := EnsureFlags(context.Background(), mp, both)
	must.NoError(t, err)
	must.Eq(t, nobody, euidAsNobody(t, bin))
	must.False(t, mountAt(t, early).HasOption("nosuid"))
	must.Eq(t, 0, euidAsNobody(t, filepath.Join(early, "id")))
}

// A class that asks for setuid=on (or devices=on) gets only the other flag,
// and a flag the mount has is never taken away.
func TestEnsureFlags_OnlyWhatIsAsked(t *testing.T) {
	p := poolFor(t)
	props := map[string]string{"setuid": "on", "devices": "off"}
	mp := newSlot(t, p, "slot", "setuid=on", "devices=off")
	bin := setuidRoot(t, mp)
	want := FlagsFor(props)
	must.Eq(t, Flags{NoDev: true}, want)

	before := mountAt(t, mp)
	_, err := EnsureFlags(context.Background(), mp, want)
	must.NoError(t, err)
	after := mountAt(t, mp)
	must.True(t, after.HasOption("nodev"))
	must.Eq(t, before.HasOption("nosuid"), after.HasOption("nosuid"), must.Sprint("nosuid left alone"))
	if !after.HasOption("nosuid") {
		must.Eq(t, 0, euidAsNobody(t, bin), must.Sprint("setuid=on: the class asked for it"))
	}

	// Now the mount has both; asking for none removes neither.
	_, err = EnsureFlags(context.Background(), mp, both)
	must.NoError(t, err)
	changed, err := EnsureFlags(context.Background(), mp, Flags{})
	must.NoError(t, err)
	must.False(t, changed)
	must.True(t, mountAt(t, mp).Satisfies(both))
}

// A bind remount must pass every per-mount flag the mount has: ro, noexec,
// the atime mode and nosymfollow survive.
func TestEnsureFlags_KeepsOtherFlags(t *testing.T) {
	p := poolFor(t)
	mp := newSlot(t, p, "slot", "setuid=off", "devices=off")
	cases := []struct {
		name  string
		flags uintptr // set on a bind of the slot before EnsureFlags
		want  []string
	}{
		{"ro noexec noatime nodiratime", unix.MS_RDONLY | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME,
			[]string{"ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime"}},
		{"strictatime", unix.MS_STRICTATIME, []string{"rw", "nosuid", "nodev"}},
		{"relatime nosymfollow", unix.MS_RELATIME | unix.MS_NOSYMFOLLOW, []string{"rw", "nosuid", "nodev", "relatime", "nosymfollow"}},
		{"nodev already", unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RELATIME, []string{"rw", "nosuid", "nodev", "noexec", "relatime"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := bindMount(t, mp)
			must.NoError(t, unix.Mount("", b, "", unix.MS_REMOUNT|unix.MS_BIND|tc.flags, ""))
			before := mountAt(t, b)
			must.False(t, before.HasOption("nosuid"), must.Sprintf("setup: %v", before.Options))

			changed, err := EnsureFlags(context.Background(), b, both)
			must.NoError(t, err)
			must.True(t, changed)
			must.Eq(t, tc.want, mountAt(t, b).Options)
		})
	}
}

func TestEnsureFlags_NotMounted(t *testing.T) {
	p := poolFor(t)
	mp := newSlot(t, p, "slot", "setuid=off", "devices=off")
	before := mountAt(t, mp)
	sub := filepath.Join(mp, "sub")
	must.NoError(t, os.Mkdir(sub, 0o755))
	cases := []struct {
		name string
		path string
	}{
		{"empty directory", t.TempDir()},
		{"directory inside the dataset", sub},
		{"missing path", filepath.Join(t.TempDir(), "gone")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changed, err := EnsureFlags(context.Background(), tc.path, both)
			must.ErrorIs(t, err, ErrNotMounted)
			must.False(t, changed)
		})
	}
	_, err := EnsureFlags(context.Background(), "relative/path", both)
	must.Error(t, err)
	must.False(t, errors.Is(err, ErrNotMounted))
	must.Eq(t, before.Options, mountAt(t, mp).Options, must.Sprint("nothing remounted"))
}

// A context that has ended stops EnsureFlags before the remount.
func TestEnsureFlags_ContextEnded(t *testing.T) {
	p := poolFor(t)
	mp := newSlot(t, p, "slot", "setuid=off", "devices=off")
	before := mountAt(t, mp)
	if before.Satisfies(both) {
		// Nothing to remount on this ZFS: EnsureFlags must not even try.
		changed, err := EnsureFlags(context.Background(), mp, both)
		must.NoError(t, err)
		must.False(t, changed)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	changed, err := EnsureFlags(ctx, mp, both)
	must.ErrorIs(t, err, context.Canceled)
	must.False(t, changed)
	must.Eq(t, before.Options, mountAt(t, mp).Options)
}
