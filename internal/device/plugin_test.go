package device_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
	"google.golang.org/protobuf/proto"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/configspec"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/structspb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m, devicetest.RemoveBuilt) }

func configBlock(parent, extra string) string {
	return fmt.Sprintf(`config {
  parent_dataset     = %q
  fingerprint_period = "300ms"
  stats_period       = "1h"
  %s
  class "scratch" {
    slots      = 2
    quota      = "64MiB"
    properties = { compression = "on" }
  }
  class "fast-io" {
    slots      = 1
    quota      = "1000000"
    mount_path = "/data/fast"
    read_only  = true
  }
}`, parent, extra)
}

// serve is a new plugin on the real zfs, served in the test's process
// over real gRPC.
func serve(t *testing.T, runner *zfs.Runner) *devicetest.Client {
	t.Helper()
	return serveLogged(t, hclog.NewNullLogger(), runner)
}

// serveLogged is serve with the plugin's log going to log.
func serveLogged(t *testing.T, log hclog.Logger, runner *zfs.Runner) *devicetest.Client {
	t.Helper()
	p := device.New(log, runner)
	t.Cleanup(p.Close)
	return devicetest.Serve(t, p)
}

// fingerprint opens the fingerprint stream for the rest of the test.
func fingerprint(t *testing.T, c *devicetest.Client) *devicetest.Stream[*devicepb.FingerprintResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := c.Fingerprint(ctx)
	must.NoError(t, err)
	return st
}

// fingerprintErr is why a fingerprint stream opened now ends at once; it
// fails the test when the stream sends a fingerprint.
func fingerprintErr(t *testing.T, c *devicetest.Client) error {
	t.Helper()
	st := fingerprint(t, c)
	for fp := range st.C {
		t.Fatalf("a fingerprint: %v", fp)
	}
	return st.Err()
}

func next(t *testing.T, st *devicetest.Stream[*devicepb.FingerprintResponse], within time.Duration) []*devicepb.DeviceGroup {
	t.Helper()
	return devicetest.Next(t, st, within).GetDeviceGroup()
}

func group(t *testing.T, groups []*devicepb.DeviceGroup, name string) *devicepb.DeviceGroup {
	t.Helper()
	return devicetest.Group(t, groups, name)
}

func intAttr(v int64, unit string) *structspb.Attribute {
	return &structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: v}, Unit: unit}
}

func strAttr(v string) *structspb.Attribute {
	return &structspb.Attribute{Value: &structspb.Attribute_StringVal{StringVal: v}}
}

func boolAttr(v bool) *structspb.Attribute {
	return &structspb.Attribute{Value: &structspb.Attribute_BoolVal{BoolVal: v}}
}

// mustProtoEq fails unless want and got are the same message.
func mustProtoEq(t *testing.T, want, got proto.Message) {
	t.Helper()
	must.True(t, proto.Equal(want, got), must.Sprintf("want %v\ngot  %v", want, got))
}

// TestPlugin_OverGRPC is the protocol test: it launches the built binary as
// Nomad's agent does (go-plugin, Nomad's handshake) and drives every call of
// the base and device services over real gRPC, with a client built from the
// project's own protocol files, against a real pool: the calls that need a
// configuration refuse before one, the schema makes the round trip (what
// ConfigSchema sends is what the plugin decodes with), bad configs are
// refused with the field named and change nothing, then Fingerprint,
// Reserve and Stats.
func TestPlugin_OverGRPC(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	p := devicetest.Launch(t, devicetest.BuildPlugin(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	info, err := p.Info()
	must.NoError(t, err)
	must.Eq(t, "nomad-device-zfs", info.GetName())
	must.Eq(t, basepb.PluginType_DEVICE, info.GetType())
	must.Eq(t, []string{"v0.1.0"}, info.GetPluginApiVersions())
	must.NotEq(t, "", info.GetPluginVersion())

	// Before SetConfig: the device calls fail, saying why.
	early, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	for range early.C {
		t.Fatal("a fingerprint before SetConfig")
	}
	must.ErrorContains(t, early.Err(), "not configured")
	_, err = p.Reserve("scratch-0")
	must.ErrorContains(t, err, "not configured")
	_, err = p.Base.SetConfig(ctx, &basepb.SetConfigRequest{})
	must.ErrorContains(t, err, "parent_dataset and a class are required")

	// The schema's round trip: what the agent receives decodes to the
	// schema the plugin reads SetConfig with.
	schema, err := p.Base.ConfigSchema(ctx, &basepb.ConfigSchemaRequest{})
	must.NoError(t, err)
	mustProtoEq(t, config.Spec.Proto(), schema.GetSpec())
	received, err := configspec.FromProto(schema.GetSpec())
	must.NoError(t, err)
	must.True(t, received.Type().Equals(config.Spec.Type()), must.Sprint(received.Type().GoString()))

	// Bad configs are rejected with the field named, and change nothing.
	err = p.SetConfig(configBlock(pool.Dataset("missing"), ""))
	must.ErrorContains(t, err, fmt.Sprintf("parent_dataset %q does not exist", pool.Dataset("missing")))
	err = p.SetConfig(configBlock(parent, `stats_period = "never"`))
	must.ErrorContains(t, err, `stats_period = "never"`)
	err = p.SetConfig(strings.Replace(configBlock(parent, ""), "slots      = 2", "slots      = 2.5", 1))
	must.ErrorContains(t, err, `class "scratch": slots = 2.5: want a whole number`)
	_, err = p.Base.SetConfig(ctx, &basepb.SetConfigRequest{MsgpackConfig: []byte{0x81, 0xa1, 'x', 0x01}})
	must.ErrorContains(t, err, "nomad-device-zfs config: decoding the config")
	must.Eq(t, "", pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", parent)[len(parent)+1:])

	must.NoError(t, p.SetConfig(configBlock(parent, "")))

	fps, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	groups := next(t, fps, 60*time.Second)
	must.SliceLen(t, 2, groups)
	g := group(t, groups, "scratch")
	must.Eq(t, "zfs", g.GetVendor())
	must.Eq(t, "dataset", g.GetDeviceType())
	must.SliceLen(t, 2, g.GetDevices())
	for i, d := range g.GetDevices() {
		must.Eq(t, fmt.Sprintf("scratch-%d", i), d.GetID())
		must.True(t, d.GetHealthy(), must.Sprintf("%s: %s", d.GetID(), d.GetHealthDescription()))
	}
	// The unit lets `${device.attr.quota} >= 5 MiB` style constraints compare.
	mustProtoEq(t, intAttr(64, "MiB"), g.GetAttributes()["quota"])
	mustProtoEq(t, strAttr(pool.Name), g.GetAttributes()["pool"])
	mustProtoEq(t, strAttr("/zfs/scratch"), g.GetAttributes()["mount_path"])
	mustProtoEq(t, boolAttr(false), g.GetAttributes()["read_only"])
	mustProtoEq(t, strAttr("off"), g.GetAttributes()["restore"])
	fast := group(t, groups, "fast-io")
	mustProtoEq(t, &structspb.Attribute{Value: &structspb.Attribute_FloatVal{FloatVal: 1000000.0 / 1024}, Unit: "KiB"}, fast.GetAttributes()["quota"])

	// One ID: the class mount path.
	res, err := p.Reserve("fast-io-0")
	must.NoError(t, err)
	must.SliceLen(t, 1, res.GetMounts())
	mp := pool.Prop(t, pool.Dataset("nomad/fast-io/0"), "mountpoint")
	mustProtoEq(t, &devicepb.Mount{TaskPath: "/data/fast", HostPath: mp, ReadOnly: true}, res.GetMounts()[0])
	must.Eq(t, map[string]string{
		"ZFS_FAST_IO_DATASET":   pool.Dataset("nomad/fast-io/0"),
		"ZFS_FAST_IO_PATH":      "/data/fast",
		"ZFS_FAST_IO_HOST_PATH": mp,
	}, res.GetEnvs())
	// Handed over with no zfs command: the dataset stays armed by this run
	// (slots/armed) until the handover is recorded behind the Reserve
	// (here with no owner: no Nomad API answers), state reserved.
	st := pool.Prop(t, pool.Dataset("nomad/fast-io/0"), "nomad-device-zfs:state")
	must.True(t, st == "reserved" || strings.HasPrefix(st, "armed:"), must.Sprintf("state %q", st))

	// Several IDs: mount_path/0, mount_path/1 in the order of the slots'
	// indexes, whatever order Nomad gives (it comes from a map).
	res, err = p.Reserve("scratch-1", "scratch-0")
	must.NoError(t, err)
	must.SliceLen(t, 2, res.GetMounts())
	mp0 := pool.Prop(t, pool.Dataset("nomad/scratch/0"), "mountpoint")
	mp1 := pool.Prop(t, pool.Dataset("nomad/scratch/1"), "mountpoint")
	mustProtoEq(t, &devicepb.Mount{TaskPath: "/zfs/scratch/0", HostPath: mp0}, res.GetMounts()[0])
	mustProtoEq(t, &devicepb.Mount{TaskPath: "/zfs/scratch/1", HostPath: mp1}, res.GetMounts()[1])
	envs := res.GetEnvs()
	must.Eq(t, pool.Dataset("nomad/scratch/0"), envs["ZFS_SCRATCH_DATASET"])
	must.Eq(t, "/zfs/scratch/0", envs["ZFS_SCRATCH_PATH"])
	must.Eq(t, pool.Dataset("nomad/scratch/1"), envs["ZFS_SCRATCH_1_DATASET"])
	must.Eq(t, "/zfs/scratch/1", envs["ZFS_SCRATCH_1_PATH"])
	must.Eq(t, mp1, envs["ZFS_SCRATCH_1_HOST_PATH"])
	must.MapLen(t, 9, envs)

	_, err = p.Reserve("scratch-7")
	must.ErrorContains(t, err, `unknown device ID "scratch-7"`)
	_, err = p.Reserve("scratch-0", "fast-io-0")
	must.ErrorContains(t, err, "different classes")

	stats, err := p.Stats(ctx, 100*time.Millisecond)
	must.NoError(t, err)
	sr := devicetest.Next(t, stats, 30*time.Second)
	must.SliceLen(t, 2, sr.GetGroups())
	var seen bool
	for _, g := range sr.GetGroups() {
		if g.GetName() != "scratch" {
			continue
		}
		seen = true
		must.MapLen(t, 2, g.GetInstanceStats())
		s := g.GetInstanceStats()["scratch-0"]
		must.Eq(t, int64(64<<20), s.GetSummary().GetIntDenominatorVal().GetValue())
		must.Positive(t, s.GetSummary().GetIntNumeratorVal().GetValue())
		must.MapContainsKeys(t, s.GetStats().GetAttributes(), []string{"used", "available", "referenced", "compressratio"})
		must.False(t, s.GetTimestamp().AsTime().IsZero())
	}
	must.True(t, seen, must.Sprint("stats of the scratch class"))
}

// TestPlugin_FingerprintOnlyOnChange: after the first fingerprint nothing is
// sent while nothing changes; an unmounted slot is reported unhealthy (never
// as a fingerprint error), and healthy again once mounted.
func TestPlugin_FingerprintOnlyOnChange(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	p := serve(t, &zfs.Runner{})
	must.NoError(t, p.SetConfig(configBlock(parent, "")))
	fps := fingerprint(t, p)
	groups := next(t, fps, 60*time.Second)
	// No Nomad agent answers here: the first release pass finds that it
	// cannot tell whether a token sees every namespace, and every device
	// says so. That change is sent once.
	for !strings.Contains(group(t, groups, "scratch").GetDevices()[0].GetHealthDescription(), "warning: cannot tell whether the Nomad token sees every namespace") {
		groups = next(t, fps, 30*time.Second)
	}

	select {
	case fp := <-fps.C:
		t.Fatalf("unexpected fingerprint with nothing changed: %v", fp)
	case <-time.After(1500 * time.Millisecond): // five fingerprint periods
	}

	// An operator's hand on the slot's state (an unmounted free slot would
	// not do: the plugin mounts it again before the next fingerprint).
	slot := pool.Dataset("nomad/scratch/1")
	pool.ZFS(t, "set", "nomad-device-zfs:state=bogus", slot)
	d := group(t, next(t, fps, 30*time.Second), "scratch").GetDevices()[1]
	must.False(t, d.GetHealthy())
	must.StrContains(t, d.GetHealthDescription(), `unknown state "bogus"`)
	_, err := p.Reserve("scratch-1")
	must.ErrorContains(t, err, "cannot be reserved")

	pool.ZFS(t, "set", "nomad-device-zfs:state=free", slot)
	must.True(t, group(t, next(t, fps, 30*time.Second), "scratch").GetDevices()[1].GetHealthy())
}

// TestPlugin_StatsServedFromCache: Nomad asks every interval; ZFS is read at
// most once per stats_period (here an hour, so only the fingerprint's sync
// reads it).
func TestPlugin_StatsServedFromCache(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	runner := &zfs.Runner{}
	p := serve(t, runner)
	must.NoError(t, p.SetConfig(configBlock(parent, `fingerprint_period = "1h"`)))
	next(t, fingerprint(t, p), 60*time.Second)
	runs := runner.Runs()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := p.Stats(ctx, 20*time.Millisecond)
	must.NoError(t, err)
	for i := 0; i < 20; i++ {
		must.SliceLen(t, 2, devicetest.Next(t, st, 10*time.Second).GetGroups())
	}
	must.Eq(t, runs, runner.Runs(), must.Sprint("stats within stats_period must not run zfs"))
}

// TestPlugin_NotConfigured: the device calls before SetConfig fail, saying
// why, and so does a SetConfig with nothing in it. Nomad ends a plugin
// whose fingerprint stream fails; it never calls one before SetConfig.
func TestPlugin_NotConfigured(t *testing.T) {
	p := serve(t, &zfs.Runner{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, open := range []func() (error, error){
		func() (error, error) {
			st, err := p.Fingerprint(ctx)
			if err != nil {
				return err, nil
			}
			for range st.C {
			}
			return nil, st.Err()
		},
		func() (error, error) {
			st, err := p.Stats(ctx, time.Second)
			if err != nil {
				return err, nil
			}
			for range st.C {
			}
			return nil, st.Err()
		},
	} {
		openErr, streamErr := open()
		must.NoError(t, openErr)
		must.ErrorContains(t, streamErr, "not configured")
	}
	_, err := p.Reserve("scratch-0")
	must.ErrorContains(t, err, "not configured")
	_, err = p.Base.SetConfig(ctx, &basepb.SetConfigRequest{})
	must.ErrorContains(t, err, "parent_dataset and a class are required")
}
