// Package version computes the plugin's version and commit from git: the one
// place where they are worked out, for `make build` (through cmd/version) and
// `make dist` alike, so that `nomad-device-zfs version` prints the same thing
// whichever built the binary.
//
// The version is SemVer and comes from the newest tag vMAJOR.MINOR.PATCH or
// vMAJOR.MINOR.PATCH-PRERELEASE reachable from HEAD (`git describe --tags
// --match 'v[0-9]*'`), without its v:
//
//	at the tag v0.3.0                0.3.0
//	3 commits after it               0.3.0+3.g1a2b3c4
//	at the tag v0.4.0-rc.1           0.4.0-rc.1
//	no tag at all                    0.0.0-dev+g1a2b3c4
//	tracked files modified           ...+dirty, or .dirty after other metadata
//
// Commits after a tag go into the build metadata, not the pre-release, so that
// Debian and RPM sort them after the tag (see Debian and RPM); every form is
// also a version that Nomad's plugin loader (hashicorp/go-version) accepts.
package version

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Info is what identifies a build.
type Info struct {
	// Version is the SemVer version, without a leading v.
	Version string
	// Commit is HEAD's abbreviated commit hash.
	Commit string
	// Time is HEAD's commit time, used for the files' times in the packages
	// so that two builds of one commit give the same packages.
	Time time.Time
}

var (
	// describeRe matches `git describe --tags --long --abbrev=7 --dirty
	// --always` at or after a tag: v1.2.3[-pre]-N-gSHA[-dirty].
	describeRe = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:-([0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*))?-([0-9]+)-g([0-9a-f]{7,40})(-dirty)?$`)
	// untaggedRe matches the same command's output when no tag is reachable:
	// SHA[-dirty].
	untaggedRe = regexp.MustCompile(`^([0-9a-f]{7,40})(-dirty)?$`)
)

// FromDescribe maps the output of `git describe --tags --match 'v[0-9]*'
// --long --abbrev=7 --dirty --always` to the version and commit. A tag that
// is not vMAJOR.MINOR.PATCH[-PRERELEASE] (pre-release: dot-separated
// letters and digits, which every package format takes) is an error.
func FromDescribe(describe string) (version, commit string, err error) {
	d := strings.TrimSpace(describe)
	if m := untaggedRe.FindStringSubmatch(d); m != nil {
		return join("0.0.0", "dev", nil, m[1], m[2] != ""), m[1], nil
	}
	m := describeRe.FindStringSubmatch(d)
	if m == nil {
		return "", "", fmt.Errorf("git describe gave %q: the newest tag matching v[0-9]* must be vMAJOR.MINOR.PATCH or vMAJOR.MINOR.PATCH-PRERELEASE (pre-release of dot-separated letters and digits)", d)
	}
	n, err := strconv.Atoi(m[5])
	if err != nil {
		return "", "", fmt.Errorf("git describe gave %q: commits since the tag: %w", d, err)
	}
	var meta []string
	if n > 0 {
		meta = append(meta, m[5], "g"+m[6])
	}
	return join(m[1]+"."+m[2]+"."+m[3], m[4], meta, "", m[7] != ""), m[6], nil
}

// join builds core[-pre][+meta...][.g<sha>][.dirty].
func join(core, pre string, meta []string, sha string, dirty bool) string {
	v := core
	if pre != "" {
		v += "-" + pre
	}
	if sha != "" {
		meta = append(meta, "g"+sha)
	}
	if dirty {
		meta = append(meta, "dirty")
	}
	if len(meta) > 0 {
		v += "+" + strings.Join(meta, ".")
	}
	return v
}

// Split splits a version made by FromDescribe into its core
// (MAJOR.MINOR.PATCH), pre-release and build metadata, which the package
// formats write each their own way.
func Split(v string) (core, pre, meta string) {
	core, meta, _ = strings.Cut(v, "+")
	core, pre, _ = strings.Cut(core, "-")
	return core, pre, meta
}

// ErrNoRepository is returned by FromGit when dir is not in a git work tree
// (a source archive, say).
var ErrNoRepository = errors.New("not in a git repository")

// FromGit works out the Info of the git work tree at dir.
func FromGit(ctx context.Context, dir string) (Info, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := git(ctx, dir, "rev-parse", "--git-dir"); err != nil {
		return Info{}, fmt.Errorf("%s: %w (%w)", dir, ErrNoRepository, err)
	}
	d, err := git(ctx, dir, "describe", "--tags", "--match", "v[0-9]*", "--long", "--abbrev=7", "--dirty", "--always")
	if err != nil {
		return Info{}, err
	}
	v, c, err := FromDescribe(d)
	if err != nil {
		return Info{}, err
	}
	ct, err := git(ctx, dir, "log", "-1", "--format=%ct", "HEAD")
	if err != nil {
		return Info{}, err
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(ct), 10, 64)
	if err != nil {
		return Info{}, fmt.Errorf("commit time %q of HEAD in %s: %w", ct, dir, err)
	}
	return Info{Version: v, Commit: c, Time: time.Unix(sec, 0).UTC()}, nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s in %s: %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
