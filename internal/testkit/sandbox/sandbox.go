// Package sandbox gives tests, benchmarks and tools a real ZFS pool on a
// sparse file, and ZFS itself where it is missing: the kernel module when
// /dev/zfs exists, otherwise a zfs-fuse daemon that StartFuse starts and
// stops by its own PID. It has no dependency on package testing; the test
// helpers in internal/testkit/zfstest wrap it.
package sandbox

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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

const (
	// DaemonPIDFile is where the zfs-fuse started by StartFuse records its PID.
	DaemonPIDFile = "/var/run/zfs-fuse.pid"

	// probeTimeout bounds one `zpool list` asking whether ZFS answers.
	probeTimeout = 10 * time.Second
	// fuseTimeout bounds zfs-fuse's start (until it answers) and its stop.
	fuseTimeout = 30 * time.Second
	// destroyPatience is how long Destroy keeps running `zpool destroy`, a
	// second apart (the runner retries a busy pool within each run too),
	// before it forces. zfs-fuse answers "pool is busy" for a while after
	// the last use of a pool with a couple of thousand mounted datasets
	// (the benchmark's 900 slots and their spares).
	destroyPatience = 2 * time.Minute
)

// StartFuse makes ZFS usable. When `zpool list` already answers (the kernel
// module, or a daemon someone else runs) it returns a nil stop and leaves
// everything alone. Otherwise it starts zfs-fuse in the foreground (so that
// this process owns its PID) and returns once the daemon answers; stop then
// sends that PID SIGTERM and returns once it has exited (killing it after
// 30 s). An error says what to install.
func StartFuse() (stop func() error, err error) {
	if _, err := exec.LookPath("zpool"); err != nil {
		return nil, errors.New("no zpool command on PATH: install zfsutils-linux (OpenZFS) or zfs-fuse")
	}
	if zpoolWorks() {
		return nil, nil
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

// Available returns nil when `zpool list` answers, and otherwise says what
// is missing. It starts nothing.
func Available() error {
	if _, err := exec.LookPath("zpool"); err != nil {
		return errors.New("no zpool command on PATH: install zfsutils-linux (OpenZFS) or zfs-fuse")
	}
	if !zpoolWorks() {
		return errors.New("`zpool list` fails: no ZFS kernel module and no zfs-fuse daemon answers")
	}
	return nil
}

// zpoolWorks reports whether `zpool list` answers within probeTimeout.
func zpoolWorks() bool {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	return exec.CommandContext(ctx, "zpool", "list", "-H", "-o", "name").Run() == nil
}

// started is the PID of the zfs-fuse daemon this process started and has
// not stopped yet (StartedDaemon), 0 when none.
var started atomic.Int64

// StartedDaemon returns the PID of the zfs-fuse daemon that StartFuse
// started in this process and that still runs, or 0: a daemon found
// running was not started here, and is not this process's to stop.
func StartedDaemon() int { return int(started.Load()) }

func startFuse(bin string) (func() error, error) {
	removeStalePIDFile(DaemonPIDFile)
	cmd := exec.Command(bin, "--no-daemon", "--pidfile", DaemonPIDFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting zfs-fuse: %w", err)
	}
	started.Store(int64(cmd.Process.Pid))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); started.Store(0) }()
	stop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			var exitErr *exec.ExitError
			if err != nil && !errors.As(err, &exitErr) {
				return err
			}
			return nil
		case <-time.After(fuseTimeout):
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("zfs-fuse did not stop within %s of SIGTERM; killed", fuseTimeout)
		}
	}
	deadline := time.Now().Add(fuseTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return nil, fmt.Errorf("zfs-fuse exited at start: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
		if zpoolWorks() {
			return stop, nil
		}
	}
	_ = stop()
	return nil, fmt.Errorf("zfs-fuse did not answer within %s", fuseTimeout)
}

// removeStalePIDFile removes a pid file whose process is gone, or that
// holds no PID: zfs-fuse refuses to start over one. A file naming a live
// process is left alone.
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

// Pool is a pool on a sparse file, made by CreatePool for one test or one
// benchmark; nothing else lives on it.
type Pool struct {
	Name       string
	Mountpoint string
	// Dir holds the pool's backing file, pool.img (for `zpool import -d Dir`).
	Dir    string
	Runner *zfs.Runner
}

// CreatePool creates a pool named prefix plus a random suffix on a sparse
// file of size bytes in dir (which must exist), mounted at dir/mnt. On
// success the pool exists and the caller destroys it with Destroy; on error
// no pool and no backing file are left.
func CreatePool(ctx context.Context, dir, prefix string, size int64) (*Pool, error) {
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
	if _, err := p.Runner.ZpoolCmd(ctx, "create", "-m", p.Mountpoint, p.Name, img); err != nil {
		_ = os.Remove(img)
		return nil, fmt.Errorf("creating pool %s: %w", p.Name, err)
	}
	return p, nil
}

// Destroy destroys the pool, retrying for about 30 s while zfs-fuse still
// reports it busy, and with -f as a last resort: the pool is a test's or a
// benchmark's own, nothing else lives on it (the plugin never forces). It
// runs to the end whatever state the caller is in (it is cleanup); each
// command is bounded by the runner's timeout. On nil the pool is gone; the
// backing file is left to the caller.
func (p *Pool) Destroy() error {
	ctx := context.Background()
	deadline := time.Now().Add(destroyPatience)
	var err error
	for {
		if _, err = p.Runner.ZpoolCmd(ctx, "destroy", p.Name); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if _, err2 := p.Runner.ZpoolCmd(ctx, "destroy", "-f", p.Name); err2 != nil {
		return fmt.Errorf("destroying pool %s: %w; then with -f: %w", p.Name, err, err2)
	}
	return nil
}

// Dataset returns the name of a dataset in the pool.
func (p *Pool) Dataset(rel string) string { return p.Name + "/" + rel }
