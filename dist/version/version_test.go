package version

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	goversion "github.com/hashicorp/go-version"
	"github.com/shoenig/test/must"
)

func TestFromDescribe(t *testing.T) {
	cases := []struct {
		describe, version, commit string
	}{
		{"v0.3.0-0-g1a2b3c4", "0.3.0", "1a2b3c4"},
		{"v0.3.0-0-g1a2b3c4-dirty", "0.3.0+dirty", "1a2b3c4"},
		{"v0.3.0-3-g1a2b3c4", "0.3.0+3.g1a2b3c4", "1a2b3c4"},
		{"v0.3.0-3-g1a2b3c4-dirty", "0.3.0+3.g1a2b3c4.dirty", "1a2b3c4"},
		{"v10.20.30-12-g1a2b3c4d5\n", "10.20.30+12.g1a2b3c4d5", "1a2b3c4d5"},
		{"v0.4.0-rc.1-0-gabcdef0", "0.4.0-rc.1", "abcdef0"},
		{"v0.4.0-rc.1-2-gabcdef0", "0.4.0-rc.1+2.gabcdef0", "abcdef0"},
		{"v1.0.0-beta2-0-gabcdef0-dirty", "1.0.0-beta2+dirty", "abcdef0"},
		{"8e079e2", "0.0.0-dev+g8e079e2", "8e079e2"},
		{"8e079e2-dirty", "0.0.0-dev+g8e079e2.dirty", "8e079e2"},
	}
	for _, tc := range cases {
		t.Run(strings.TrimSpace(tc.describe), func(t *testing.T) {
			v, c, err := FromDescribe(tc.describe)
			must.NoError(t, err)
			must.EqOp(t, tc.version, v)
			must.EqOp(t, tc.commit, c)
			// Nomad's plugin loader parses the plugin's version with
			// hashicorp/go-version and refuses the plugin when it cannot.
			_, err = goversion.NewVersion(v)
			must.NoError(t, err, must.Sprintf("Nomad could not parse %q", v))
		})
	}
}

func TestFromDescribeRefusesOtherTags(t *testing.T) {
	for _, d := range []string{
		"v1.2-0-g1a2b3c4",         // no patch
		"v01.2.3-0-g1a2b3c4",      // leading zero
		"v1.2.3-rc-1-0-g1a2b3c4",  // hyphen in the pre-release: a Debian revision
		"v1.2.3_rc1-0-g1a2b3c4",   // underscore
		"v1.2.3+meta-0-g1a2b3c4",  // build metadata in the tag
		"v1.2.3-0-gXYZ",           // not a hash
		"",                        // nothing
		"fatal: no names found",   // not describe's output
		"v1.2.3 -0-g1a2b3c4",      // space
		"v1.2.3-rc.1.-0-g1a2b3c4", // empty identifier
	} {
		t.Run(d, func(t *testing.T) {
			_, _, err := FromDescribe(d)
			must.ErrorContains(t, err, "vMAJOR.MINOR.PATCH")
			must.StrContains(t, err.Error(), strings.TrimSpace(d))
		})
	}
}

func TestSplit(t *testing.T) {
	cases := []struct{ v, core, pre, meta string }{
		{"0.3.0", "0.3.0", "", ""},
		{"0.3.0+3.g1a2b3c4.dirty", "0.3.0", "", "3.g1a2b3c4.dirty"},
		{"0.4.0-rc.1", "0.4.0", "rc.1", ""},
		{"0.0.0-dev+g8e079e2", "0.0.0", "dev", "g8e079e2"},
	}
	for _, tc := range cases {
		t.Run(tc.v, func(t *testing.T) {
			core, pre, meta := Split(tc.v)
			must.EqOp(t, tc.core, core)
			must.EqOp(t, tc.pre, pre)
			must.EqOp(t, tc.meta, meta)
		})
	}
}

// TestFromGit runs FromGit in a real git repository through its life: no
// tag, a tag, commits after it, modified files.
func TestFromGit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
			"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		must.NoError(t, err, must.Sprintf("git %v: %s", args, out))
		return strings.TrimSpace(string(out))
	}
	write := func(content string) {
		t.Helper()
		must.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644))
	}

	_, err := FromGit(ctx, dir)
	must.ErrorIs(t, err, ErrNoRepository)

	run("init", "-q")
	write("1")
	run("add", "f")
	run("commit", "-q", "-m", "one")
	sha := run("rev-parse", "--short=7", "HEAD")
	info, err := FromGit(ctx, dir)
	must.NoError(t, err)
	must.EqOp(t, "0.0.0-dev+g"+sha, info.Version)
	must.EqOp(t, sha, info.Commit)
	must.EqOp(t, run("log", "-1", "--format=%ct"), strconv.FormatInt(info.Time.Unix(), 10))

	run("tag", "not-a-version") // ignored: does not match v[0-9]*
	run("tag", "v0.3.0")
	info, err = FromGit(ctx, dir)
	must.NoError(t, err)
	must.EqOp(t, "0.3.0", info.Version)

	write("2")
	info, err = FromGit(ctx, dir)
	must.NoError(t, err)
	must.EqOp(t, "0.3.0+dirty", info.Version)

	run("commit", "-q", "-am", "two")
	write("3")
	run("commit", "-q", "-am", "three")
	sha = run("rev-parse", "--short=7", "HEAD")
	info, err = FromGit(ctx, dir)
	must.NoError(t, err)
	must.EqOp(t, "0.3.0+2.g"+sha, info.Version)
	must.EqOp(t, sha, info.Commit)

	run("tag", "v0.4")
	_, err = FromGit(ctx, dir)
	must.ErrorContains(t, err, `"v0.4-0-g`+sha+`"`)
}
