package device_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// onZFSFuse reports whether the tests run on zfs-fuse (no kernel module),
// whose ZFS predates lz4.
func onZFSFuse() bool {
	_, fuse := exec.LookPath("zfs-fuse")
	_, dev := os.Stat("/dev/zfs")
	return fuse == nil && dev != nil
}

// tunedClass is a class block with the given properties, to add to
// configBlock's two classes.
func tunedClass(props string) string {
	return fmt.Sprintf(`class "tuned" {
    slots      = 1
    quota      = "8MiB"
    properties = { %s }
  }`, props)
}

// tunedOnly is a configuration whose only class is tunedClass(props).
func tunedOnly(parent, props string) string {
	return fmt.Sprintf("config {\n  parent_dataset = %q\n  %s\n}", parent, tunedClass(props))
}

// under lists the parent and every dataset below it.
func under(t *testing.T, pool *zfstest.Pool, parent string) []string {
	t.Helper()
	return strings.Fields(pool.ZFS(t, "list", "-H", "-r", "-o", "name", parent))
}

// TestSetConfig_ProbeRefusedProperties: properties that ZFS refuses make
// SetConfig fail with the class, the property, the value and ZFS's own
// message, and leave nothing under the parent: no probe, no .archive, no
// class dataset. Accepted properties pass and leave nothing either.
func TestSetConfig_ProbeRefusedProperties(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	lz4 := "lz4" // zfs-fuse 0.7 has no lz4
	if !onZFSFuse() {
		lz4 = "gzip-10" // refused by every ZFS
	}
	refused := func(prop, value string) []string {
		return []string{fmt.Sprintf(`nomad-device-zfs config: class "tuned": properties: %s = %q: ZFS refused it: `, prop, value)}
	}
	cases := []struct {
		name, props string
		want        []string
	}{
		{"compression unknown to this ZFS", fmt.Sprintf("compression = %q", lz4), refused("compression", lz4)},
		{"compression bogus", `compression = "bogus"`, refused("compression", "bogus")},
		{"recordsize not a power of two", `recordsize = "3M"`, refused("recordsize", "3M")},
		{"unknown property", `nosuchprop = "1"`, refused("nosuchprop", "1")},
		{"read-only property", `used = "1"`, refused("used", "1")},
		{"valid alone, refused together", `normalization = "formD", utf8only = "off"`, []string{
			`nomad-device-zfs config: class "tuned": properties: ZFS accepts each of `,
			`normalization = "formD", refquota = "8388608", setuid = "off", utf8only = "off" alone but refused them together: `,
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := pool.Dataset(fmt.Sprintf("nomad%d", i))
			pool.ZFS(t, "create", parent)
			p := serve(t, &zfs.Runner{})
			err := p.SetConfig(tunedOnly(parent, `compression = "on", `+tc.props))
			for _, w := range tc.want {
				must.ErrorContains(t, err, w)
			}
			must.ErrorContains(t, err, fmt.Sprintf("cannot create '%s/.probe-", parent)) // ZFS's message
			must.Eq(t, []string{parent}, under(t, pool, parent))
			must.ErrorContains(t, fingerprintErr(t, p), "not configured")
		})
	}

	t.Run("accepted properties", func(t *testing.T) {
		parent := pool.Dataset("valid")
		pool.ZFS(t, "create", parent)
		p := serve(t, &zfs.Runner{})
		must.NoError(t, p.SetConfig(configBlock(parent, tunedClass(`compression = "on", atime = "off"`))))
		must.Eq(t, []string{parent}, under(t, pool, parent))
	})
}

// faultyZFS returns a zfs command that runs the real one, except that it
// fails with message the commands whose first argument is verb and that name
// a probe dataset. It stands for faults a real ZFS cannot be made to show
// on demand: a probe that will not go away, a daemon that stops answering.
func faultyZFS(t *testing.T, verb, message string) string {
	t.Helper()
	real, err := exec.LookPath("zfs")
	must.NoError(t, err)
	script := fmt.Sprintf(`#!/bin/sh
if [ "$1" = %q ]; then
  for a in "$@"; do
    case "$a" in */.probe-*) echo %q >&2; exit 1;; esac
  done
fi
exec %q "$@"
`, verb, message, real)
	path := filepath.Join(t.TempDir(), "zfs")
	must.NoError(t, os.WriteFile(path, []byte(script), 0o755))
	return path
}

// syncBuffer is a log sink safe for the runner's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSetConfig_ProbeFaults: a failure that is not about the properties is
// reported as such and blames no property; a probe that cannot be destroyed
// is logged at error level with its name and named in the error, never left
// silently. Either way the configuration is not taken.
func TestSetConfig_ProbeFaults(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	cases := []struct {
		name, verb, message string
		want                []string
		leftProbe           bool
	}{
		{
			name: "zfs unavailable", verb: "create", message: "connect: Connection refused",
			want: []string{`class "fast-io": properties cannot be checked: creating probe dataset `, "connect: Connection refused"},
		},
		{
			name: "nothing can be created", verb: "create", message: "cannot create: out of space",
			want: []string{`class "fast-io": properties cannot be checked: ZFS refuses to create even a plain dataset under `, "out of space"},
		},
		{
			name: "probe cannot be destroyed", verb: "destroy", message: "cannot destroy: injected fault",
			want:      []string{`class "fast-io": properties cannot be checked: probe dataset `, "could not be destroyed; destroy it by hand", "injected fault"},
			leftProbe: true,
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := pool.Dataset(fmt.Sprintf("fault%d", i))
			pool.ZFS(t, "create", parent)
			var logs syncBuffer
			log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Error})
			p := serveLogged(t, log, &zfs.Runner{ZFS: faultyZFS(t, tc.verb, tc.message)})
			err := p.SetConfig(configBlock(parent, ""))
			must.Error(t, err)
			for _, w := range tc.want {
				must.ErrorContains(t, err, w)
			}
			must.StrNotContains(t, err.Error(), "refused it")
			must.ErrorContains(t, fingerprintErr(t, p), "not configured")

			left := under(t, pool, parent)
			if !tc.leftProbe {
				must.Eq(t, []string{parent}, left)
				return
			}
			must.SliceLen(t, 2, left)
			probe := left[1]
			must.StrHasPrefix(t, parent+"/.probe-", probe)
			must.ErrorContains(t, err, "probe dataset "+probe+" could not be destroyed")
			must.StrContains(t, logs.String(), "[ERROR]")
			must.StrContains(t, logs.String(), "dataset="+probe)
		})
	}
}
