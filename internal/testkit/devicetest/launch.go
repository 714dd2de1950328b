package devicetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/pluginhost"
)

// buildTimeout bounds one build of the plugin (a cold build cache included).
const buildTimeout = 10 * time.Minute

// PrebuiltEnv names a plugin binary built from this tree beforehand, which
// BuildPlugin then uses instead of building one. The OpenZFS VM's runner
// (scripts/openzfs-vm/run-go.sh) sets it: it builds the binary on the host,
// where a build costs seconds, not the minute of a link under emulation.
const PrebuiltEnv = "NOMAD_DEVICE_ZFS_TEST_PLUGIN"

// built is the plugin binary built once per test process by BuildPlugin.
// Its once guards dir, bin and err.
var built struct {
	once sync.Once
	dir  string // the process-wide directory holding bin; RemoveBuilt deletes it
	bin  string
	err  error
}

// BuildPlugin returns the path of the plugin binary, alone in a directory of
// the test's own (a plugin_dir: tests may add files beside it). The binary is
// built once per test process (or taken from $NOMAD_DEVICE_ZFS_TEST_PLUGIN,
// PrebuiltEnv) and linked (or copied) into each test's directory: a build
// is a link step even with a warm cache, about a minute under emulation. A
// failed build, or a prebuilt binary that is not there, fails every test
// that asks. A package that calls it removes the shared build with
// RemoveBuilt at the end, e.g.
//
//	func TestMain(m *testing.M) { zfstest.Main(m, devicetest.RemoveBuilt) }
func BuildPlugin(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		if pre := os.Getenv(PrebuiltEnv); pre != "" {
			fi, err := os.Stat(pre)
			if err == nil && !fi.Mode().IsRegular() {
				err = fmt.Errorf("%s is not a regular file", pre)
			}
			if err != nil {
				built.err = fmt.Errorf("the prebuilt plugin %s: %w", PrebuiltEnv, err)
				return
			}
			built.bin = pre // built.dir stays empty: RemoveBuilt leaves it
			return
		}
		built.dir, built.err = os.MkdirTemp("", "nomad-device-zfs-build-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "nomad-device-zfs")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		built.err = pluginhost.Build(ctx, built.bin)
	})
	if built.err != nil {
		t.Fatalf("%v", built.err)
	}
	bin := filepath.Join(t.TempDir(), "nomad-device-zfs")
	if err := linkOrCopy(built.bin, bin); err != nil {
		t.Fatalf("placing the plugin binary: %v", err)
	}
	return bin
}

// RemoveBuilt deletes what BuildPlugin built for the whole process. It is
// for TestMain, after the tests ran.
func RemoveBuilt() {
	if built.dir != "" {
		if err := os.RemoveAll(built.dir); err != nil {
			fmt.Fprintf(os.Stderr, "devicetest: removing %s: %v\n", built.dir, err)
		}
	}
}

// linkOrCopy makes dst the same file as src: a hard link where the two are
// on one filesystem, else a copy with src's mode. On return dst is complete
// or absent.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(dst)
		return err
	}
	return nil
}

// Launch starts the plugin binary the way a Nomad client does (go-plugin,
// Nomad's handshake, gRPC only) and returns a client of it. The plugin
// process is stopped at cleanup, and its log is shown when the test
// failed.
func Launch(t testing.TB, bin string) *Client {
	t.Helper()
	logs := &pluginhost.LogBuffer{}
	p, err := pluginhost.Launch(bin, hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Debug, Output: logs}))
	if err != nil {
		t.Fatalf("%v\nplugin log:\n%s", err, logs.String())
	}
	t.Cleanup(p.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", logs.String())
		}
	})
	return &Client{Conn: p.Conn, t: t}
}
