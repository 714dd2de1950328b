package device_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// A shared class and a class with a golden source through the plugin's
// API on a real pool: SetConfig refuses a source that does not exist;
// the fingerprint shows the shared attribute; Reserve of the shared class
// bind-mounts the operator's dataset read-only, and of the golden class a
// clone holding the golden file; stats report the shared dataset.
func TestPlugin_SharedAndGoldenClasses(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent, models, gold := pool.Dataset("nomad"), pool.Dataset("models"), pool.Dataset("golden")
	for _, ds := range []string{parent, models, gold} {
		pool.ZFS(t, "create", ds)
	}
	must.NoError(t, os.WriteFile(filepath.Join(pool.Prop(t, gold, "mountpoint"), "seed.txt"), []byte("golden"), 0o644))
	pool.ZFS(t, "snapshot", gold+"@v1")
	block := func(source string) string {
		return fmt.Sprintf(`config {
  parent_dataset     = %q
  fingerprint_period = "300ms"
  stats_period       = "1h"
  class "models" {
    shared  = true
    dataset = %q
    slots   = 2
  }
  class "ci" {
    slots  = 1
    quota  = "64MiB"
    source = %q
  }
}`, parent, models, source)
	}
	p := device.New(hclog.NewNullLogger(), &zfs.Runner{})
	err := p.SetConfig(encode(t, p, block(gold+"@nope")))
	must.ErrorContains(t, err, fmt.Sprintf(`class "ci": source = "%s@nope": no such snapshot`, gold))
	must.NoError(t, p.SetConfig(encode(t, p, block(gold+"@v1"))))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	fp := recvFingerprint(t, ch, 60*time.Second)
	g := group(t, fp.Devices, "models")
	must.True(t, *g.Attributes["shared"].Bool)
	must.True(t, *g.Attributes["read_only"].Bool)
	must.SliceLen(t, 2, g.Devices)
	for _, d := range g.Devices {
		must.True(t, d.Healthy, must.Sprint(d.HealthDesc))
	}
	must.False(t, *group(t, fp.Devices, "ci").Attributes["shared"].Bool)

	res, err := p.Reserve([]string{"models-1"})
	must.NoError(t, err)
	must.SliceLen(t, 1, res.Mounts)
	must.Eq(t, "/zfs/models", res.Mounts[0].TaskPath)
	must.Eq(t, pool.Prop(t, models, "mountpoint"), res.Mounts[0].HostPath)
	must.True(t, res.Mounts[0].ReadOnly)
	must.Eq(t, models, res.Envs["ZFS_MODELS_DATASET"])

	res, err = p.Reserve([]string{"ci-0"})
	must.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(res.Mounts[0].HostPath, "seed.txt"))
	must.NoError(t, err)
	must.Eq(t, "golden", string(b))
	must.Eq(t, gold+"@v1", pool.Prop(t, res.Envs["ZFS_CI_DATASET"], "origin"))

	stats, err := p.Stats(ctx, 100*time.Millisecond)
	must.NoError(t, err)
	select {
	case st := <-stats:
		var found bool
		for _, sg := range st.Groups {
			if sg.Name == "models" {
				found = true
				must.MapLen(t, 2, sg.InstanceStats)
				must.Positive(t, *sg.InstanceStats["models-0"].Summary.IntNumeratorVal)
			}
		}
		must.True(t, found, must.Sprint("stats of the shared class"))
	case <-time.After(30 * time.Second):
		t.Fatal("no stats")
	}
}

// An encrypted class: on zfs-fuse SetConfig refuses it, naming the class
// and the field; on OpenZFS the plugin makes the key directory (0700) and
// offers encrypted slots, each with a key there. A key directory others
// can read is refused.
func TestPlugin_EncryptedClass(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	keys := filepath.Join(t.TempDir(), "keys")
	block := fmt.Sprintf(`config {
  parent_dataset     = %q
  fingerprint_period = "300ms"
  key_dir            = %q
  class "secret" {
    slots      = 1
    quota      = "64MiB"
    encryption = true
  }
}`, parent, keys)
	p := device.New(hclog.NewNullLogger(), &zfs.Runner{})
	err := p.SetConfig(encode(t, p, block))
	if _, kernel := os.Stat("/dev/zfs"); kernel != nil {
		must.ErrorContains(t, err, `class "secret": encryption = true: this ZFS (zfs-fuse) has no native encryption`)
		must.Eq(t, "", pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", parent)[len(parent)+1:], must.Sprint("a refused config changes nothing"))
		return
	}
	must.NoError(t, err)
	fi, err := os.Stat(keys)
	must.NoError(t, err)
	must.Eq(t, os.FileMode(0o700), fi.Mode().Perm())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	fp := recvFingerprint(t, ch, 60*time.Second)
	must.True(t, group(t, fp.Devices, "secret").Devices[0].Healthy, must.Sprint(group(t, fp.Devices, "secret").Devices[0].HealthDesc))
	must.True(t, *group(t, fp.Devices, "secret").Attributes["encrypted"].Bool)
	res, err := p.Reserve([]string{"secret-0"})
	must.NoError(t, err)
	ds := res.Envs["ZFS_SECRET_DATASET"]
	must.NotEq(t, "off", pool.Prop(t, ds, "encryption"))
	must.FileExists(t, filepath.Join(keys, pool.Prop(t, ds, "nomad-device-zfs:key-id")+".key"))

	must.NoError(t, os.Chmod(keys, 0o755))
	p2 := device.New(hclog.NewNullLogger(), &zfs.Runner{})
	must.ErrorContains(t, p2.SetConfig(encode(t, p2, block)), fmt.Sprintf(`key_dir = %q: %s has mode 0755`, keys, keys))
}
