package device_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
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
	p := serve(t, &zfs.Runner{})
	err := p.SetConfig(block(gold + "@nope"))
	must.ErrorContains(t, err, fmt.Sprintf(`class "ci": source = "%s@nope": no such snapshot`, gold))
	must.NoError(t, p.SetConfig(block(gold+"@v1")))

	groups := next(t, fingerprint(t, p), 60*time.Second)
	g := group(t, groups, "models")
	must.True(t, g.GetAttributes()["shared"].GetBoolVal())
	must.True(t, g.GetAttributes()["read_only"].GetBoolVal())
	must.SliceLen(t, 2, g.GetDevices())
	for _, d := range g.GetDevices() {
		must.True(t, d.GetHealthy(), must.Sprint(d.GetHealthDescription()))
	}
	mustProtoEq(t, boolAttr(false), group(t, groups, "ci").GetAttributes()["shared"])

	res, err := p.Reserve("models-1")
	must.NoError(t, err)
	must.SliceLen(t, 1, res.GetMounts())
	must.Eq(t, "/zfs/models", res.GetMounts()[0].GetTaskPath())
	must.Eq(t, pool.Prop(t, models, "mountpoint"), res.GetMounts()[0].GetHostPath())
	must.True(t, res.GetMounts()[0].GetReadOnly())
	must.Eq(t, models, res.GetEnvs()["ZFS_MODELS_DATASET"])

	res, err = p.Reserve("ci-0")
	must.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(res.GetMounts()[0].GetHostPath(), "seed.txt"))
	must.NoError(t, err)
	must.Eq(t, "golden", string(b))
	must.Eq(t, gold+"@v1", pool.Prop(t, res.GetEnvs()["ZFS_CI_DATASET"], "origin"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stats, err := p.Stats(ctx, 100*time.Millisecond)
	must.NoError(t, err)
	var found bool
	for _, sg := range devicetest.Next(t, stats, 30*time.Second).GetGroups() {
		if sg.GetName() == "models" {
			found = true
			must.MapLen(t, 2, sg.GetInstanceStats())
			must.Positive(t, sg.GetInstanceStats()["models-0"].GetSummary().GetIntNumeratorVal().GetValue())
		}
	}
	must.True(t, found, must.Sprint("stats of the shared class"))
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
	p := serve(t, &zfs.Runner{})
	err := p.SetConfig(block)
	if _, kernel := os.Stat("/dev/zfs"); kernel != nil {
		must.ErrorContains(t, err, `class "secret": encryption = true: this ZFS (zfs-fuse) has no native encryption`)
		must.Eq(t, "", pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", parent)[len(parent)+1:], must.Sprint("a refused config changes nothing"))
		return
	}
	must.NoError(t, err)
	fi, err := os.Stat(keys)
	must.NoError(t, err)
	must.Eq(t, os.FileMode(0o700), fi.Mode().Perm())

	secret := group(t, next(t, fingerprint(t, p), 60*time.Second), "secret")
	must.True(t, secret.GetDevices()[0].GetHealthy(), must.Sprint(secret.GetDevices()[0].GetHealthDescription()))
	must.True(t, secret.GetAttributes()["encrypted"].GetBoolVal())
	res, err := p.Reserve("secret-0")
	must.NoError(t, err)
	ds := res.GetEnvs()["ZFS_SECRET_DATASET"]
	must.NotEq(t, "off", pool.Prop(t, ds, "encryption"))
	must.FileExists(t, filepath.Join(keys, pool.Prop(t, ds, "nomad-device-zfs:key-id")+".key"))

	must.NoError(t, os.Chmod(keys, 0o755))
	p2 := serve(t, &zfs.Runner{})
	must.ErrorContains(t, p2.SetConfig(block), fmt.Sprintf(`key_dir = %q: %s has mode 0755`, keys, keys))
}
