// Package testenv is the one place where a test may decide not to run. Skip
// skips the test, except under CI=true, where it fails it: in CI a missing
// part (ZFS, a Nomad binary, a Go toolchain) or a -short run must never pass
// as a silent skip. Every skip in the module goes through this package;
// TestEverySkipGoesThroughTestenv keeps it so.
package testenv

import (
	"os"
	"testing"
)

// CI reports whether the tests run under CI=true, where nothing may skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Skip stops the test because why: it skips it, or under CI=true fails it.
// With a real testing.TB it never returns.
func Skip(t testing.TB, why string) {
	t.Helper()
	if CI() {
		t.Fatalf("cannot run under CI=true, where nothing may skip: %s", why)
		return
	}
	t.Skipf("skipping: %s", why)
}

// SkipShort skips the test under `go test -short` (through Skip, so that
// -short fails it under CI=true), saying what the test does that is too long
// or too heavy for a short run. It returns when the test is to run.
func SkipShort(t testing.TB, what string) {
	t.Helper()
	skipShort(t, testing.Short(), what)
}

func skipShort(t testing.TB, short bool, what string) {
	t.Helper()
	if short {
		Skip(t, "-short: "+what)
	}
}

// OptIn skips t unless the environment variable env is "1", whatever CI
// says: for recipes run by hand (rewriting captured testdata), which are
// not tests and have nothing missing.
func OptIn(t testing.TB, env, why string) {
	t.Helper()
	if os.Getenv(env) != "1" {
		t.Skipf("set %s=1 to run: %s", env, why)
	}
}
