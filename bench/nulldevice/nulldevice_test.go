package nulldevice

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"google.golang.org/grpc"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
)

// serve is a new plugin served in the test's process over real gRPC
// (nomadplugin.Connect), as Nomad's agent sees it.
func serve(t *testing.T) *devicetest.Client {
	t.Helper()
	return devicetest.Serve(t, New(hclog.NewNullLogger()))
}

// configure returns a new plugin set up from an agent's config block, as
// Nomad does: the HCL encoded with the schema the plugin returns over the
// wire; the error is SetConfig's.
func configure(t *testing.T, block string) (*devicetest.Client, error) {
	t.Helper()
	c := serve(t)
	return c, c.SetConfig(block)
}

func block(name, instances, hostDir, mountPath, env string) string {
	return "config {\n  name = \"" + name + "\"\n  instances = " + instances + "\n  host_dir = \"" + hostDir +
		"\"\n  mount_path = \"" + mountPath + "\"\n  path_env = \"" + env + "\"\n}\n"
}

func TestPluginInfo(t *testing.T) {
	info, err := serve(t).Info()
	must.NoError(t, err)
	must.Eq(t, PluginName, info.GetName())
	must.Eq(t, basepb.PluginType_DEVICE, info.GetType())
	must.Eq(t, []string{"v0.1.0"}, info.GetPluginApiVersions())
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
			c, err := configure(t, tc.block)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				_, err := c.Reserve("null-0")
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

// Before SetConfig, every call says the plugin is not configured: the
// streams end at once with the error.
func TestUnconfigured(t *testing.T) {
	c := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fps, err := c.Fingerprint(ctx)
	must.NoError(t, err)
	must.ErrorContains(t, mustEnd(t, fps), "not configured")
	stats, err := c.Stats(ctx, time.Second)
	must.NoError(t, err)
	must.ErrorContains(t, mustEnd(t, stats), "not configured")
	_, err = c.Reserve("null-0")
	must.ErrorContains(t, err, "not configured")
}

func TestFingerprint(t *testing.T) {
	dir := t.TempDir()
	c, err := configure(t, block("null", "3", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH"))
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fps, err := c.Fingerprint(ctx)
	must.NoError(t, err)
	fp := devicetest.Next(t, fps, 10*time.Second)
	must.Eq(t, []string{"null-0", "null-1", "null-2"}, healthyIDs(t, fp.GetDeviceGroup()))

	// Validated again with the same block: nothing new to send.
	must.NoError(t, c.SetConfig(block("null", "3", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH")))
	select {
	case fp := <-fps.C:
		t.Fatalf("a fingerprint after a SetConfig that changed nothing: %v", fp)
	case <-time.After(200 * time.Millisecond):
	}
	// A block with another device: sent at once.
	must.NoError(t, c.SetConfig(block("null", "4", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH")))
	fp = devicetest.Next(t, fps, 10*time.Second)
	must.Eq(t, []string{"null-0", "null-1", "null-2", "null-3"}, healthyIDs(t, fp.GetDeviceGroup()))
	cancel()
	mustEnd(t, fps)
}

// healthyIDs checks that groups are the one group of null devices, all
// healthy, and returns their IDs.
func healthyIDs(t *testing.T, groups []*devicepb.DeviceGroup) []string {
	t.Helper()
	must.SliceLen(t, 1, groups)
	g := groups[0]
	must.Eq(t, Vendor+"/"+DeviceType+"/null", g.GetVendor()+"/"+g.GetDeviceType()+"/"+g.GetDeviceName())
	var ids []string
	for _, d := range g.GetDevices() {
		must.True(t, d.GetHealthy(), must.Sprintf("device %s healthy", d.GetID()))
		ids = append(ids, d.GetID())
	}
	return ids
}

// mustEnd fails unless the stream ends within 10 s (messages before its
// end are skipped) and returns why it ended.
func mustEnd[T any](t *testing.T, s *devicetest.Stream[T]) error {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, open := <-s.C:
			if !open {
				return s.Err()
			}
		case <-timeout:
			t.Fatal("the stream did not end")
			return nil
		}
	}
}

func TestReserve(t *testing.T) {
	dir := t.TempDir()
	c, err := configure(t, block("null", "2", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH"))
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
			res, err := c.Reserve(tc.ids...)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, map[string]string{"ZFS_SCRATCH_PATH": "/zfs/scratch"}, res.GetEnvs())
			must.SliceLen(t, 1, res.GetMounts())
			must.Eq(t, "/zfs/scratch", res.GetMounts()[0].GetTaskPath())
			must.Eq(t, filepath.Join(dir, tc.ids[0]), res.GetMounts()[0].GetHostPath())
			must.False(t, res.GetMounts()[0].GetReadOnly())
		})
	}
}

func TestStats(t *testing.T) {
	c, err := configure(t, block("null", "1", t.TempDir(), "/zfs/scratch", "ZFS_SCRATCH_PATH"))
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stats, err := c.Stats(ctx, 10*time.Millisecond)
	must.NoError(t, err)
	for range 2 {
		s := devicetest.Next(t, stats, 10*time.Second)
		must.SliceEmpty(t, s.GetGroups())
	}
	cancel()
	mustEnd(t, stats)
}

// sink is a server stream whose Send blocks until the test reads the
// message from sent or ctx ends: it shows the plugin's side of a stream
// ending, which a gRPC client does not see (its stream ends as soon as
// its own context does).
type sink[T any] struct {
	grpc.ServerStream
	ctx  context.Context
	sent chan *T
}

func (s *sink[T]) Context() context.Context { return s.ctx }

func (s *sink[T]) Send(m *T) error {
	select {
	case s.sent <- m:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// The fingerprint and stats loops end when their stream's context does,
// whether or not anyone read their first message, with no error.
func TestStreamsEndWithTheirContext(t *testing.T) {
	p := New(hclog.NewNullLogger())
	c := devicetest.Serve(t, p)
	must.NoError(t, c.SetConfig(block("null", "1", t.TempDir(), "/zfs/scratch", "ZFS_SCRATCH_PATH")))
	// Each runs a loop on a stream of ctx; with read, the stream's
	// messages are read, and first is closed at the first one; without,
	// none is read and the first Send blocks.
	type loop func(ctx context.Context, read bool, first chan<- struct{}) error
	fingerprint := func(ctx context.Context, read bool, first chan<- struct{}) error {
		s := &sink[devicepb.FingerprintResponse]{ctx: ctx, sent: make(chan *devicepb.FingerprintResponse)}
		if read {
			go forward(ctx, s.sent, first)
		}
		return p.Fingerprint(&devicepb.FingerprintRequest{}, s)
	}
	stats := func(ctx context.Context, read bool, first chan<- struct{}) error {
		s := &sink[devicepb.StatsResponse]{ctx: ctx, sent: make(chan *devicepb.StatsResponse)}
		if read {
			go forward(ctx, s.sent, first)
		}
		return p.Stats(&devicepb.StatsRequest{}, s)
	}
	cases := []struct {
		name string
		run  loop
		read bool
	}{
		{name: "fingerprint, after its first message", run: fingerprint, read: true},
		{name: "fingerprint, its first message never read", run: fingerprint},
		{name: "stats, after its first message", run: stats, read: true},
		{name: "stats, its first message never read", run: stats},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first := make(chan struct{})
			ended := make(chan error, 1)
			go func() { ended <- tc.run(ctx, tc.read, first) }()
			if tc.read {
				select {
				case <-first:
				case <-time.After(10 * time.Second):
					t.Fatal("no first message")
				}
			} else {
				select {
				case err := <-ended:
					t.Fatalf("the loop ended before its context: %v", err)
				case <-time.After(50 * time.Millisecond):
				}
			}
			cancel()
			select {
			case err := <-ended:
				must.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the loop did not end after its context")
			}
		})
	}
}

// forward takes the messages sent into sent until ctx ends, and closes
// first at the first one.
func forward[T any](ctx context.Context, sent <-chan *T, first chan<- struct{}) {
	closed := false
	for {
		select {
		case <-sent:
			if !closed {
				close(first)
				closed = true
			}
		case <-ctx.Done():
			return
		}
	}
}
