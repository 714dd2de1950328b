package nulldevice

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/pluginhost"
)

// configure returns the plugin set up from an agent's config block, as
// Nomad does: the HCL encoded with the plugin's own schema.
func configure(t *testing.T, block string) (*Plugin, error) {
	t.Helper()
	p := New(hclog.NewNullLogger())
	spec, err := p.ConfigSchema()
	must.NoError(t, err)
	b, err := pluginhost.EncodeConfig(spec, block)
	must.NoError(t, err)
	return p, p.SetConfig(&base.Config{PluginConfig: b})
}

func block(name, instances, hostDir, mountPath, env string) string {
	return "config {\n  name = \"" + name + "\"\n  instances = " + instances + "\n  host_dir = \"" + hostDir +
		"\"\n  mount_path = \"" + mountPath + "\"\n  path_env = \"" + env + "\"\n}\n"
}

func TestSetConfig(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name  string
		block string
		err   string // "" when the block is taken
	}{
		{name: "taken", block: block("null", "2", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH")},
		{name: "no name", block: block("", "2", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH"), err: "name is empty"},
		{name: "no instances", block: block("null", "0", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH"), err: "instances = 0"},
		{name: "a relative host_dir", block: block("null", "2", "here", "/zfs/scratch", "ZFS_SCRATCH_PATH"), err: `host_dir = "here"`},
		{name: "mount_path is /", block: block("null", "2", dir, "/", "ZFS_SCRATCH_PATH"), err: `mount_path = "/"`},
		{name: "no path_env", block: block("null", "2", dir, "/zfs/scratch", ""), err: "path_env is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := configure(t, tc.block)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				_, err := p.Reserve([]string{"null-0"})
				must.ErrorContains(t, err, "not configured")
				return
			}
			must.NoError(t, err)
			for _, id := range []string{"null-0", "null-1"} {
				fi, err := os.Stat(filepath.Join(dir, id))
				must.NoError(t, err)
				must.True(t, fi.IsDir())
				// The task runs as nobody: its directory is writable by all,
				// whatever the umask.
				must.Eq(t, os.FileMode(0o777), fi.Mode().Perm())
			}
			// Nomad calls SetConfig again to validate: the same block is
			// taken again.
			_, err = configure(t, tc.block)
			must.NoError(t, err)
		})
	}
}

// Before SetConfig, every call says the plugin is not configured.
func TestUnconfigured(t *testing.T) {
	p := New(hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := p.Fingerprint(ctx)
	must.ErrorContains(t, err, "not configured")
	_, err = p.Stats(ctx, time.Second)
	must.ErrorContains(t, err, "not configured")
	_, err = p.Reserve([]string{"null-0"})
	must.ErrorContains(t, err, "not configured")
}

func TestFingerprint(t *testing.T) {
	p, err := configure(t, block("null", "3", t.TempDir(), "/zfs/scratch", "ZFS_SCRATCH_PATH"))
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	fp := <-ch
	must.NotNil(t, fp)
	must.SliceLen(t, 1, fp.Devices)
	g := fp.Devices[0]
	must.Eq(t, Vendor+"/"+DeviceType+"/null", g.Vendor+"/"+g.Type+"/"+g.Name)
	var ids []string
	for _, d := range g.Devices {
		must.True(t, d.Healthy, must.Sprintf("device %s healthy", d.ID))
		ids = append(ids, d.ID)
	}
	must.Eq(t, []string{"null-0", "null-1", "null-2"}, ids)
	cancel()
	mustClose(t, ch)

	// Cancelled before anyone reads: the first answer is dropped and the
	// channel closes.
	ctx, cancel = context.WithCancel(context.Background())
	ch, err = p.Fingerprint(ctx)
	must.NoError(t, err)
	cancel()
	mustClose(t, ch)
}

// mustClose fails unless ch is closed within 10 s (answers before its
// close are skipped).
func mustClose[T any](t *testing.T, ch <-chan T) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, open := <-ch:
			if !open {
				return
			}
		case <-timeout:
			t.Fatal("the channel did not close after its context ended")
		}
	}
}

func TestReserve(t *testing.T) {
	dir := t.TempDir()
	p, err := configure(t, block("null", "2", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH"))
	must.NoError(t, err)
	cases := []struct {
		name string
		ids  []string
		err  string
	}{
		{name: "one device", ids: []string{"null-1"}},
		{name: "unknown", ids: []string{"null-2"}, err: `unknown device ID "null-2"`},
		{name: "two at once", ids: []string{"null-0", "null-1"}, err: "one device at a time, not 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := p.Reserve(tc.ids)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, map[string]string{"ZFS_SCRATCH_PATH": "/zfs/scratch"}, res.Envs)
			must.SliceLen(t, 1, res.Mounts)
			must.Eq(t, "/zfs/scratch", res.Mounts[0].TaskPath)
			must.Eq(t, filepath.Join(dir, tc.ids[0]), res.Mounts[0].HostPath)
			must.False(t, res.Mounts[0].ReadOnly)
		})
	}
}

func TestStats(t *testing.T) {
	p, err := configure(t, block("null", "1", t.TempDir(), "/zfs/scratch", "ZFS_SCRATCH_PATH"))
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := p.Stats(ctx, 10*time.Millisecond)
	must.NoError(t, err)
	for range 2 {
		s := <-ch
		must.NotNil(t, s)
		must.SliceEmpty(t, s.Groups)
	}
	cancel()
	mustClose(t, ch)
}
