// Package zfstest gives tests a real ZFS pool on a sparse file: the kernel
// module where /dev/zfs exists, zfs-fuse otherwise. A package whose tests use
// it calls Main from TestMain: Main starts zfs-fuse when it is installed and
// not already running, and stops it (by the PID it started) when the tests
// are done. When neither is available, NewPool skips the test, except under
// CI=true, where it fails it (see internal/testkit/testenv).
//
// It is the test-facing wrapper of internal/testkit/sandbox, which benchmarks and
// tools use without package testing.
package zfstest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/sandbox"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ran and unavailable are set by Main: unavailable says why no ZFS could be
// had, and NewPool reports it. Without Main, NewPool asks sandbox.Available
// once instead.
var (
	ran         bool
	unavailable string
	probe       sync.Once
)

// Main runs the tests of a package with ZFS available. Use it as
//
//	func TestMain(m *testing.M) { zfstest.Main(m) }
//
// atExit runs, in order, after the tests and before zfs-fuse is stopped:
// the place for what lives as long as the test process (a plugin binary
// built once, for instance).
func Main(m *testing.M, atExit ...func()) {
	ran = true
	stop, err := sandbox.StartFuse()
	if err != nil {
		unavailable = err.Error()
	}
	code := m.Run()
	for _, f := range atExit {
		f()
	}
	if stop != nil {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "zfstest: stopping zfs-fuse: %v\n", err)
		}
	}
	os.Exit(code)
}

// DaemonPIDFile is where the zfs-fuse started by StartFuse records its PID.
const DaemonPIDFile = sandbox.DaemonPIDFile

// StartedDaemon is sandbox.StartedDaemon: the PID of the zfs-fuse daemon
// this test binary started (zfstest.Main), 0 when it started none.
func StartedDaemon() int { return sandbox.StartedDaemon() }

// StartFuse makes ZFS usable outside `go test`; see sandbox.StartFuse. A nil
// stop means ZFS already answered and nothing was started.
func StartFuse() (stop func() error, err error) { return sandbox.StartFuse() }

// Pool is a file-backed pool that lives for one test. Its fields (Name,
// Mountpoint, Dir, Runner) and the methods Destroy and Dataset come from
// sandbox.Pool.
type Pool struct {
	*sandbox.Pool
}

// NewPool creates a pool of the given size (bytes; 2 GiB when 0) on a sparse
// file and destroys it when the test ends. When no ZFS is available it
// skips the test, or fails it under CI=true. It works without Main when ZFS
// already answers.
func NewPool(t testing.TB, size int64) *Pool {
	t.Helper()
	if !ran {
		probe.Do(func() {
			if err := sandbox.Available(); err != nil {
				unavailable = err.Error() + " (and no zfstest.Main in TestMain to start zfs-fuse)"
			}
		})
	}
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
// caller destroys it with Destroy. Code outside tests uses
// sandbox.CreatePool.
func CreatePool(dir, prefix string, size int64) (*Pool, error) {
	p, err := sandbox.CreatePool(context.Background(), dir, prefix, size)
	if err != nil {
		return nil, err
	}
	return &Pool{Pool: p}, nil
}

// Unavailable skips the test, or fails it under CI=true, where a missing part
// must never pass silently. It is testenv.Skip.
func Unavailable(t testing.TB, why string) {
	t.Helper()
	testenv.Skip(t, why)
}

// ZFS runs a zfs command for test setup and fails the test when it fails.
func (p *Pool) ZFS(t testing.TB, args ...string) string {
	t.Helper()
	out, err := p.Runner.ZFSCmd(context.Background(), args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(out)
}

// The capabilities of this machine's ZFS, probed once per test binary:
// every pool of it has the same ZFS.
var (
	capsOnce sync.Once
	caps     zfs.Capabilities
	capsErr  error
)

// Capabilities returns what this machine's ZFS does (zfs.Client.Probe, as
// the plugin probes at start), probed on the first call on a scratch
// dataset under parent, a dataset of p, and the same answer after that.
func (p *Pool) Capabilities(t testing.TB, parent string) zfs.Capabilities {
	t.Helper()
	capsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		caps, capsErr = zfs.NewClient(&zfs.Runner{}).Probe(ctx, parent+"/.probe-caps")
	})
	if capsErr != nil {
		t.Fatalf("probing zfs: %v", capsErr)
	}
	return caps
}

// Look mounts dataset ds for the test to look inside, and returns where,
// with unmount to undo it. A dataset that `zfs mount` cannot mount where
// it is (mountpoint=none: the plugin's archive on OpenZFS) is mounted
// read-only at a directory of the test's with `mount -t zfs -o zfsutil`,
// as docs/operations.md tells an operator to; any other with `zfs mount`,
// after `zfs set canmount=noauto` when it is canmount=off (the plugin's
// archive where its release unmounts first: zfs-fuse), as that page says.
func (p *Pool) Look(t testing.TB, ds string) (dir string, unmount func()) {
	t.Helper()
	dir = p.Prop(t, ds, "mountpoint")
	if dir != "none" {
		if p.Prop(t, ds, "canmount") == "off" {
			p.ZFS(t, "set", "canmount=noauto", ds)
		}
		p.ZFS(t, "mount", ds)
		return dir, func() { p.ZFS(t, "unmount", ds) }
	}
	dir = t.TempDir()
	run := func(name string, args ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), propTimeout)
		defer cancel()
		if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	run("mount", "-t", "zfs", "-o", "zfsutil,ro,nosuid,nodev", ds, dir)
	return dir, func() { run("umount", dir) }
}

// Prop returns one property of a dataset ("" when unset), and fails the
// test when it cannot be read.
func (p *Pool) Prop(t testing.TB, dataset, prop string) string {
	t.Helper()
	v, err := p.TryProp(dataset, prop)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return v
}

// TryProp returns one property of a dataset ("" when unset), or the error:
// for polls that may look while the plugin renames the dataset away and
// creates a fresh one in its place.
func (p *Pool) TryProp(dataset, prop string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), propTimeout)
	defer cancel()
	ds, err := zfs.NewClient(p.Runner).Get(ctx, dataset, 0, prop)
	if err != nil {
		return "", err
	}
	if len(ds) != 1 {
		return "", fmt.Errorf("zfs get %s %s: %d datasets", prop, dataset, len(ds))
	}
	v, _ := ds[0].Value(prop)
	return v, nil
}

// propTimeout bounds one property read.
const propTimeout = 30 * time.Second
