// Package nomadtest runs a real Nomad agent for end-to-end tests: the pinned
// Nomad binary (built from the repository's e2e/nomad module and cached),
// a dev-mode agent on free ports with this repository's device plugin, and
// helpers that wait on the agent through its HTTP API.
//
// Nothing here is mocked. When Nomad cannot be had (no Go toolchain, the
// build fails), tests skip, except under CI=true where they fail, with the
// semantics of zfstest.Unavailable.
package nomadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

const (
	// PinnedVersion is the Nomad version required by e2e/nomad/go.mod. The
	// go.mod is the source of truth; TestPinnedVersionMatchesGoMod keeps
	// this constant in step with it. It names the cached binary when the
	// repository cannot be found.
	PinnedVersion = "v1.11.3"

	// buildTimeout bounds one build of Nomad (1-9 minutes on two cores,
	// plus module downloads on a cold module cache).
	buildTimeout = 20 * time.Minute
	// lockTimeout bounds the wait for another process's build.
	lockTimeout = 25 * time.Minute
)

// Binary returns the path of the pinned Nomad binary: $NOMAD_BIN when set;
// otherwise ${XDG_CACHE_HOME:-$HOME/.cache}/nomad-device-zfs/nomad-<version>,
// built from the repository's e2e/nomad module when missing (under a file
// lock, so that concurrent test processes and scripts/build-nomad.sh build
// it once). When no binary can be had the test is skipped, or failed under
// CI=true.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("NOMAD_BIN"); bin != "" {
		if err := localagent.CheckExecutable(bin); err != nil {
			zfstest.Unavailable(t, fmt.Sprintf("NOMAD_BIN=%s: %v", bin, err))
		}
		return bin
	}
	root, rootErr := localagent.RepoRoot()
	version := PinnedVersion
	if rootErr == nil {
		v, err := localagent.PinnedVersionOf(root)
		if err != nil {
			zfstest.Unavailable(t, err.Error())
		}
		version = v
	}
	bin, err := localagent.CachedBinaryPath(version)
	if err != nil {
		zfstest.Unavailable(t, err.Error())
	}
	if localagent.CheckExecutable(bin) == nil {
		return bin
	}
	if rootErr != nil {
		zfstest.Unavailable(t, fmt.Sprintf("no Nomad at %s and cannot build it: %v", bin, rootErr))
	}
	t.Logf("no cached Nomad: building %s into %s (several minutes; scripts/build-nomad.sh does the same)", version, bin)
	start := time.Now()
	if err := Build(root, bin); err != nil {
		zfstest.Unavailable(t, fmt.Sprintf("building Nomad %s: %v", version, err))
	}
	t.Logf("Nomad ready after %s (built here, or by another process holding the lock)", time.Since(start).Round(time.Second))
	return bin
}

// Build builds Nomad from root/e2e/nomad into bin, unless bin appears while
// waiting for the lock. The lock is bin+".lock", taken with flock(2), which
// scripts/build-nomad.sh takes too (flock(1)).
func Build(root, bin string) error {
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(bin+".lock", lockTimeout)
	if err != nil {
		return err
	}
	defer unlock()
	if localagent.CheckExecutable(bin) == nil {
		return nil // another process built it while we waited
	}
	if _, err := exec.LookPath("go"); err != nil {
		return errors.New("no go command on PATH")
	}
	tmp := fmt.Sprintf("%s.tmp.%d", bin, os.Getpid())
	defer os.Remove(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// The default -mod=readonly: e2e/nomad/go.sum is complete and kept, so
	// the build is reproducible and never edits the repository.
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, localagent.NomadModule)
	cmd.Dir = filepath.Join(root, "e2e", "nomad")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", localagent.NomadModule, cmd.Dir, err, out)
	}
	return os.Rename(tmp, bin)
}

// lockFile takes an exclusive flock on path, polling until timeout.
func lockFile(path string, timeout time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("%s still locked by another build after %s", path, timeout)
		}
		time.Sleep(time.Second)
	}
}
