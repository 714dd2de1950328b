package device_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	nomaddevice "github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
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

func encode(t *testing.T, p nomaddevice.DevicePlugin, block string) *base.Config {
	t.Helper()
	spec, err := p.ConfigSchema()
	must.NoError(t, err)
	b, err := devicetest.EncodeConfig(spec, block)
	must.NoError(t, err)
	return &base.Config{PluginConfig: b, ApiVersion: nomaddevice.ApiVersion010}
}

func recvFingerprint(t *testing.T, ch <-chan *nomaddevice.FingerprintResponse, within time.Duration) *nomaddevice.FingerprintResponse {
	t.Helper()
	select {
	case fp, ok := <-ch:
		must.True(t, ok, must.Sprint("fingerprint stream closed"))
		must.NoError(t, fp.Error)
		return fp
	case <-time.After(within):
		t.Fatalf("no fingerprint within %s", within)
	}
	return nil
}

func group(t *testing.T, groups []*nomaddevice.DeviceGroup, name string) *nomaddevice.DeviceGroup {
	t.Helper()
	for _, g := range groups {
		if g.Name == name {
			return g
		}
	}
	t.Fatalf("no device group %q", name)
	return nil
}

// TestPlugin_OverGRPC launches the built binary as Nomad does and drives the
// whole device API over real gRPC against a real pool.
func TestPlugin_OverGRPC(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	p := devicetest.Launch(t, devicetest.BuildPlugin(t))

	info, err := p.PluginInfo()
	must.NoError(t, err)
	must.Eq(t, "nomad-device-zfs", info.Name)
	must.Eq(t, base.PluginTypeDevice, info.Type)

	// Bad configs are rejected with the field named, and change nothing.
	err = p.SetConfig(encode(t, p, configBlock(pool.Dataset("missing"), "")))
	must.ErrorContains(t, err, fmt.Sprintf("parent_dataset %q does not exist", pool.Dataset("missing")))
	err = p.SetConfig(encode(t, p, configBlock(parent, `stats_period = "never"`)))
	must.ErrorContains(t, err, `stats_period = "never"`)
	must.Eq(t, "", pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", parent)[len(parent)+1:])

	must.NoError(t, p.SetConfig(encode(t, p, configBlock(parent, ""))))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fpCh, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	fp := recvFingerprint(t, fpCh, 60*time.Second)
	must.SliceLen(t, 2, fp.Devices)
	g := group(t, fp.Devices, "scratch")
	must.Eq(t, "zfs", g.Vendor)
	must.Eq(t, "dataset", g.Type)
	must.SliceLen(t, 2, g.Devices)
	for i, d := range g.Devices {
		must.Eq(t, fmt.Sprintf("scratch-%d", i), d.ID)
		must.True(t, d.Healthy, must.Sprintf("%s: %s", d.ID, d.HealthDesc))
	}
	must.Eq(t, structs.NewIntAttribute(64, structs.UnitMiB), g.Attributes["quota"])
	must.Eq(t, structs.NewStringAttribute(pool.Name), g.Attributes["pool"])
	must.Eq(t, structs.NewStringAttribute("/zfs/scratch"), g.Attributes["mount_path"])
	must.Eq(t, structs.NewBoolAttribute(false), g.Attributes["read_only"])
	must.Eq(t, structs.NewStringAttribute("off"), g.Attributes["restore"])
	// The unit lets `${device.attr.quota} >= 5 MiB` style constraints compare.
	cmp, ok := g.Attributes["quota"].Compare(structs.NewIntAttribute(65536, structs.UnitKiB))
	must.True(t, ok)
	must.Eq(t, 0, cmp)
	fast := group(t, fp.Devices, "fast-io")
	must.Eq(t, structs.NewFloatAttribute(1000000.0/1024, structs.UnitKiB), fast.Attributes["quota"])

	// One ID: the class mount path.
	res, err := p.Reserve([]string{"fast-io-0"})
	must.NoError(t, err)
	must.SliceLen(t, 1, res.Mounts)
	mp := pool.Prop(t, pool.Dataset("nomad/fast-io/0"), "mountpoint")
	must.Eq(t, &nomaddevice.Mount{TaskPath: "/data/fast", HostPath: mp, ReadOnly: true}, res.Mounts[0])
	must.Eq(t, map[string]string{
		"ZFS_FAST_IO_DATASET":   pool.Dataset("nomad/fast-io/0"),
		"ZFS_FAST_IO_PATH":      "/data/fast",
		"ZFS_FAST_IO_HOST_PATH": mp,
	}, res.Envs)
	// Handed over with no zfs command: the dataset stays armed by this run
	// (slots/armed.go) until the handover is recorded behind the Reserve
	// (here with no owner: no Nomad API answers), state reserved.
	st := pool.Prop(t, pool.Dataset("nomad/fast-io/0"), "nomad-device-zfs:state")
	must.True(t, st == "reserved" || strings.HasPrefix(st, "armed:"), must.Sprintf("state %q", st))

	// Several IDs: mount_path/0, mount_path/1 in the order of the slots'
	// indexes, whatever order Nomad gives (it comes from a map).
	res, err = p.Reserve([]string{"scratch-1", "scratch-0"})
	must.NoError(t, err)
	must.SliceLen(t, 2, res.Mounts)
	mp0 := pool.Prop(t, pool.Dataset("nomad/scratch/0"), "mountpoint")
	mp1 := pool.Prop(t, pool.Dataset("nomad/scratch/1"), "mountpoint")
	must.Eq(t, &nomaddevice.Mount{TaskPath: "/zfs/scratch/0", HostPath: mp0}, res.Mounts[0])
	must.Eq(t, &nomaddevice.Mount{TaskPath: "/zfs/scratch/1", HostPath: mp1}, res.Mounts[1])
	must.Eq(t, pool.Dataset("nomad/scratch/0"), res.Envs["ZFS_SCRATCH_DATASET"])
	must.Eq(t, "/zfs/scratch/0", res.Envs["ZFS_SCRATCH_PATH"])
	must.Eq(t, pool.Dataset("nomad/scratch/1"), res.Envs["ZFS_SCRATCH_1_DATASET"])
	must.Eq(t, "/zfs/scratch/1", res.Envs["ZFS_SCRATCH_1_PATH"])
	must.Eq(t, mp1, res.Envs["ZFS_SCRATCH_1_HOST_PATH"])
	must.MapLen(t, 9, res.Envs)

	_, err = p.Reserve([]string{"scratch-7"})
	must.ErrorContains(t, err, `unknown device ID "scratch-7"`)
	_, err = p.Reserve([]string{"scratch-0", "fast-io-0"})
	must.ErrorContains(t, err, "different classes")

	statsCh, err := p.Stats(ctx, 100*time.Millisecond)
	must.NoError(t, err)
	select {
	case st := <-statsCh:
		must.NoError(t, st.Error)
		must.SliceLen(t, 2, st.Groups)
		for _, g := range st.Groups {
			if g.Name != "scratch" {
				continue
			}
			must.MapLen(t, 2, g.InstanceStats)
			s := g.InstanceStats["scratch-0"]
			must.Eq(t, int64(64<<20), *s.Summary.IntDenominatorVal)
			must.Positive(t, *s.Summary.IntNumeratorVal)
			must.MapContainsKeys(t, s.Stats.Attributes, []string{"used", "available", "referenced", "compressratio"})
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no stats within 30s")
	}
}

// TestPlugin_FingerprintOnlyOnChange: after the first fingerprint nothing is
// sent while nothing changes; an unmounted slot is reported unhealthy (never
// as a fingerprint error), and healthy again once mounted.
func TestPlugin_FingerprintOnlyOnChange(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	p := device.New(hclog.NewNullLogger(), &zfs.Runner{})
	must.NoError(t, p.SetConfig(encode(t, p, configBlock(parent, ""))))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	fp := recvFingerprint(t, ch, 60*time.Second)
	// No Nomad agent answers here: the first release pass finds that it
	// cannot tell whether a token sees every namespace, and every device
	// says so. That change is sent once.
	for !strings.Contains(group(t, fp.Devices, "scratch").Devices[0].HealthDesc, "warning: cannot tell whether the Nomad token sees every namespace") {
		fp = recvFingerprint(t, ch, 30*time.Second)
	}

	select {
	case fp := <-ch:
		t.Fatalf("unexpected fingerprint with nothing changed: %+v", fp.Devices[0])
	case <-time.After(1500 * time.Millisecond): // five fingerprint periods
	}

	// An operator's hand on the slot's state (an unmounted free slot would
	// not do: the plugin mounts it again before the next fingerprint).
	slot := pool.Dataset("nomad/scratch/1")
	pool.ZFS(t, "set", "nomad-device-zfs:state=bogus", slot)
	fp = recvFingerprint(t, ch, 30*time.Second)
	d := group(t, fp.Devices, "scratch").Devices[1]
	must.False(t, d.Healthy)
	must.StrContains(t, d.HealthDesc, `unknown state "bogus"`)
	_, err = p.Reserve([]string{"scratch-1"})
	must.ErrorContains(t, err, "cannot be reserved")

	pool.ZFS(t, "set", "nomad-device-zfs:state=free", slot)
	fp = recvFingerprint(t, ch, 30*time.Second)
	must.True(t, group(t, fp.Devices, "scratch").Devices[1].Healthy)
}

// TestPlugin_StatsServedFromCache: Nomad asks every interval; ZFS is read at
// most once per stats_period (here an hour, so only the fingerprint's sync
// reads it).
func TestPlugin_StatsServedFromCache(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	runner := &zfs.Runner{}
	p := device.New(hclog.NewNullLogger(), runner)
	must.NoError(t, p.SetConfig(encode(t, p, configBlock(parent, `fingerprint_period = "1h"`))))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fpCh, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	recvFingerprint(t, fpCh, 60*time.Second)
	runs := runner.Runs()

	st, err := p.Stats(ctx, 20*time.Millisecond)
	must.NoError(t, err)
	for i := 0; i < 20; i++ {
		select {
		case r := <-st:
			must.NoError(t, r.Error)
			must.SliceLen(t, 2, r.Groups)
		case <-time.After(10 * time.Second):
			t.Fatal("stats stream stalled")
		}
	}
	must.Eq(t, runs, runner.Runs(), must.Sprint("stats within stats_period must not run zfs"))
}

func TestPlugin_NotConfigured(t *testing.T) {
	p := device.New(hclog.NewNullLogger(), &zfs.Runner{})
	_, err := p.Fingerprint(context.Background())
	must.ErrorContains(t, err, "not configured")
	_, err = p.Reserve([]string{"scratch-0"})
	must.ErrorContains(t, err, "not configured")
	err = p.SetConfig(&base.Config{})
	must.ErrorContains(t, err, "parent_dataset and a class are required")
}
