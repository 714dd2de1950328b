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
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

const (
	// ModulePath is the product's module; RepoRoot looks for its go.mod.
	ModulePath = "github.com/nomad-device-zfs/nomad-device-zfs"
	// NomadModule is the module whose main package is the Nomad agent.
	NomadModule = "github.com/hashicorp/nomad"
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
		if err := checkExecutable(bin); err != nil {
			zfstest.Unavailable(t, fmt.Sprintf("NOMAD_BIN=%s: %v", bin, err))
		}
		return bin
	}
	root, rootErr := RepoRoot()
	version := PinnedVersion
	if rootErr == nil {
		v, err := PinnedVersionOf(root)
		if err != nil {
			zfstest.Unavailable(t, err.Error())
		}
		version = v
	}
	bin, err := CachedBinaryPath(version)
	if err != nil {
		zfstest.Unavailable(t, err.Error())
	}
	if checkExecutable(bin) == nil {
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

// CachedBinaryPath is where the binary of a Nomad version is cached.
func CachedBinaryPath(version string) (string, error) {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no XDG_CACHE_HOME and no home directory: %w", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "nomad-device-zfs", "nomad-"+version), nil
}

// RepoRoot walks up from the working directory to the directory whose
// go.mod declares ModulePath.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if mod, err := modulePath(filepath.Join(dir, "go.mod")); err == nil && mod == ModulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

// PinnedVersionOf reads the version of NomadModule that the repository's
// e2e/nomad/go.mod requires.
func PinnedVersionOf(root string) (string, error) {
	path := filepath.Join(root, "e2e", "nomad", "go.mod")
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 && fields[0] == "require" {
			fields = fields[1:]
		}
		if len(fields) >= 2 && fields[0] == NomadModule && strings.HasPrefix(fields[1], "v") {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s requires no %s", path, NomadModule)
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
	if checkExecutable(bin) == nil {
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
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, NomadModule)
	cmd.Dir = filepath.Join(root, "e2e", "nomad")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", NomadModule, cmd.Dir, err, out)
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

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

func modulePath(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`), nil
		}
	}
	return "", fmt.Errorf("%s has no module line", gomod)
}
