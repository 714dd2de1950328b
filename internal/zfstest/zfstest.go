// Package zfstest gives tests a real ZFS pool on a sparse file: the kernel
// module where /dev/zfs exists, zfs-fuse otherwise. A package whose tests use
// it calls Main from TestMain: Main starts zfs-fuse when it is installed and
// not already running, and stops it (by the PID it started) when the tests
// are done. When neither is available, NewPool skips the test, except under
// CI=true, where it fails it.
package zfstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// unavailable is set by Main when no ZFS could be had; NewPool reports it.
var unavailable string

// Main runs the tests of a package with ZFS available. Use it as
//
//	func TestMain(m *testing.M) { zfstest.Main(m) }
func Main(m *testing.M) {
	stop, err := ensureZFS()
	if err != nil {
		unavailable = err.Error()
	}
	code := m.Run()
	if stop != nil {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "zfstest: stopping zfs-fuse: %v\n", err)
		}
	}
	os.Exit(code)
}

// ensureZFS makes zfs usable. It returns a stop function when it started a
// zfs-fuse daemon, nil when ZFS was already there.
func ensureZFS() (stop func() error, err error) {
	if _, err := exec.LookPath("zpool"); err != nil {
		return nil, errors.New("no zpool command on PATH: install zfsutils-linux (OpenZFS) or zfs-fuse")
	}
	if zpoolWorks() {
		return nil, nil // kernel module, or a daemon someone else runs
	}
	if _, err := os.Stat("/dev/zfs"); err == nil {
		return nil, errors.New("/dev/zfs exists but `zpool list` fails")
	}
	bin, err := exec.LookPath("zfs-fuse")
	if err != nil {
		return nil, errors.New("no /dev/zfs and no zfs-fuse on PATH: apt-get install zfs-fuse")
	}
	return startFuse(bin)
}

func zpoolWorks() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "zpool", "list", "-H", "-o", "name").Run() == nil
}

// DaemonPIDFile is where the zfs-fuse started by StartFuse records its PID.
const DaemonPIDFile = "/var/run/zfs-fuse.pid"

// StartFuse starts zfs-fuse in the foreground (so that this process owns its
// PID) and waits until it answers. The returned stop sends SIGTERM to that
// PID and waits for it to exit. It is exported for the benchmarks and tools
// that need ZFS outside `go test`.
func StartFuse() (stop func() error, err error) {
	if zpoolWorks() {
		return nil, nil
	}
	bin, err := exec.LookPath("zfs-fuse")
	if err != nil {
		return nil, errors.New("no zfs-fuse on PATH: apt-get install zfs-fuse")
	}
	return startFuse(bin)
}

func startFuse(bin string) (func() error, error) {
	removeStalePIDFile(DaemonPIDFile)
	cmd := exec.Command(bin, "--no-daemon", "--pidfile", DaemonPIDFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting zfs-fuse: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			var exitErr *exec.ExitError
			if err != nil && !errors.As(err, &exitErr) {
				return err
			}
			return nil
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			return errors.New("zfs-fuse did not stop within 30s of SIGTERM; killed")
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return nil, fmt.Errorf("zfs-fuse exited at start: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if zpoolWorks() {
			return stop, nil
		}
	}
	_ = stop()
	return nil, errors.New("zfs-fuse did not answer within 30s")
}

// removeStalePIDFile removes a pid file whose process is gone: zfs-fuse
// refuses to start over one.
func removeStalePIDFile(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &pid); err == nil && pid > 0 {
		if syscall.Kill(pid, 0) == nil {
			return
		}
	}
	_ = os.Remove(path)
}

// Pool is a file-backed pool that lives for one test.
type Pool struct {
	Name       string
	Mountpoint string
	// Dir holds the pool's backing file (for `zpool import -d Dir`).
	Dir    string
	Runner *zfs.Runner
}

// NewPool creates a pool of the given size (bytes; 2 GiB when 0) on a sparse
// file and destroys it when the test ends.
func NewPool(t testing.TB, size int64) *Pool {
	t.Helper()
	if unavailable != "" {
		Unavailable(t, unavailable)
	}
	if size == 0 {
		size = 2 << 30
	}
	p, err := CreatePool(t.TempDir(), "ndz", size)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(); err != nil {
			t.Logf("%v", err)
		}
	})
	return p
}

// CreatePool creates a pool named prefix plus a random suffix on a sparse
// file of size bytes in dir (which must exist), mounted under dir/mnt. The
// caller destroys it with Destroy. The benchmarks use it outside tests.
func CreatePool(dir, prefix string, size int64) (*Pool, error) {
	img := filepath.Join(dir, "pool.img")
	f, err := os.Create(img)
	if err != nil {
		return nil, fmt.Errorf("creating pool file: %w", err)
	}
	err = f.Truncate(size)
	_ = f.Close()
	if err != nil {
		_ = os.Remove(img)
		return nil, fmt.Errorf("sizing pool file: %w", err)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	p := &Pool{
		Name:       prefix + hex.EncodeToString(suffix[:]),
		Mountpoint: filepath.Join(dir, "mnt"),
		Dir:        dir,
		Runner:     &zfs.Runner{},
	}
	if out, err := exec.Command("zpool", "create", "-m", p.Mountpoint, p.Name, img).CombinedOutput(); err != nil {
		_ = os.Remove(img)
		return nil, fmt.Errorf("zpool create %s: %v: %s", p.Name, err, strings.TrimSpace(string(out)))
	}
	return p, nil
}

// Unavailable skips the test, or fails it under CI=true, where a missing part
// must never pass silently.
func Unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("required for this test and missing under CI=true: %s", why)
	}
	t.Skipf("skipping: %s", why)
}

// Destroy destroys the pool, retrying for up to 30 s while zfs-fuse still
// reports it busy, and with -f as a last resort: the pool is a test's or a
// benchmark's own, nothing else lives on it. The plugin never forces.
func (p *Pool) Destroy() error {
	var out []byte
	var err error
	for i := 0; i < 30; i++ {
		if out, err = exec.Command("zpool", "destroy", p.Name).CombinedOutput(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	if out2, err2 := exec.Command("zpool", "destroy", "-f", p.Name).CombinedOutput(); err2 != nil {
		return fmt.Errorf("zpool destroy %s: %v: %s; then -f: %v: %s", p.Name, err, strings.TrimSpace(string(out)), err2, strings.TrimSpace(string(out2)))
	}
	return nil
}

// Dataset returns the name of a dataset in the pool.
func (p *Pool) Dataset(rel string) string { return p.Name + "/" + rel }

// ZFS runs a zfs command for test setup and fails the test when it fails.
func (p *Pool) ZFS(t testing.TB, args ...string) string {
	t.Helper()
	out, err := p.Runner.ZFSCmd(context.Background(), args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(out)
}

// Prop returns one property of a dataset ("" when unset).
func (p *Pool) Prop(t testing.TB, dataset, prop string) string {
	t.Helper()
	ds, err := zfs.NewClient(p.Runner).Get(context.Background(), dataset, 0, prop)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if len(ds) != 1 {
		t.Fatalf("zfs get %s %s: %d datasets", prop, dataset, len(ds))
	}
	v, _ := ds[0].Value(prop)
	return v
}
