package slots_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// keyFiles lists the key files in dir.
func keyFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	must.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// rawCopy sends ds@snap raw (ciphertext, no key) into copy: the copy can
// be opened only with the dataset's key.
func rawCopy(t *testing.T, e *env, ds, copy string) {
	t.Helper()
	e.pool.ZFS(t, "snapshot", ds+"@raw")
	out, err := exec.Command("sh", "-c", "zfs send -w \"$1\" | zfs receive -u \"$2\"", "sh", ds+"@raw", copy).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	e.pool.ZFS(t, "destroy", ds+"@raw")
}

// loadKey tries to open copy with the key file at keyPath.
func loadKey(e *env, copy, keyPath string) error {
	_, err := e.pool.Runner.ZFSCmd(context.Background(), "load-key", "-L", "file://"+keyPath, copy)
	return err
}

// Per-slot encryption on a real pool. On OpenZFS: each fresh dataset has
// its own raw key in the key directory (0600, 32 bytes), which it points
// to; archive and restore keep it; after a destroy (on_release =
// "destroy", or retention pruning an archive) the key file is gone, and a
// raw copy of the data taken before can no longer be opened. On zfs-fuse,
// which has no encryption, the create fails and leaves no key behind (the
// plugin refuses such a class at SetConfig: see internal/device).
func TestEncryption_KeyPerSlotLivesAndDiesWithItsData(t *testing.T) {
	e := newEnv(t, 1)
	keys := filepath.Join(t.TempDir(), "keys")
	must.NoError(t, record.EnsureKeyDir(keys))
	e.cfg.KeyDir = keys
	e.cfg.Classes[0].Encrypted = true
	e.cfg.Classes[0].Restore = slots.RestoreRequired
	e.cfg.Classes = append(e.cfg.Classes, slots.Class{Name: "temp", Slots: 1, Quota: 64 << 20, UID: 65534, GID: 65534, Mode: 0o770,
		OnRelease: slots.OnReleaseDestroy, Encrypted: true})
	e.mgr.SetConfig(e.cfg)
	pruner := retention.New(zfs.NewClient(e.runner), hclog.NewNullLogger())
	pruner.SetConfig(retention.Config{Container: e.cfg.ArchiveDataset(), KeyDir: keys,
		Rules: retention.Rules{Default: retention.Policy{Keep: 3}}})
	e.mgr.SetArchives(pruner)
	a := newAllocs()
	e.mgr.SetNomad(a)
	ctx := context.Background()

	if !e.pool.Capabilities(t, e.cfg.Parent).Encryption {
		err := e.mgr.Sync(ctx)
		must.ErrorIs(t, err, zfs.ErrInvalid, must.Sprint("zfs-fuse refuses encryption=on"))
		must.SliceEmpty(t, keyFiles(t, keys), must.Sprint("the key of a dataset that was not made is removed"))
		return
	}

	for _, s := range e.sync(t) {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
		id := e.pool.Prop(t, s.Dataset, record.PropKeyID)
		must.True(t, record.ValidKeyID(id), must.Sprint(id))
		must.NotEq(t, "off", e.pool.Prop(t, s.Dataset, "encryption"))
		must.Eq(t, "raw", e.pool.Prop(t, s.Dataset, "keyformat"))
		must.Eq(t, record.KeyLocation(keys, id), e.pool.Prop(t, s.Dataset, "keylocation"))
		fi, err := os.Stat(record.KeyPath(keys, id))
		must.NoError(t, err)
		must.Eq(t, int64(record.KeyLen), fi.Size())
		must.Eq(t, os.FileMode(0o600), fi.Mode().Perm())
	}
	// Each slot (and spare) its own key.
	must.SliceLen(t, 2, keyFiles(t, keys))

	// Archive, then restore: the key follows the dataset.
	first := tenant(1, 0)
	s := reserveAndWrite(t, e, a, "scratch-0", first)
	id := e.pool.Prop(t, s.Dataset, record.PropKeyID)
	a.end(first)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	arch := archived(t, e)
	must.SliceLen(t, 1, arch)
	must.Eq(t, id, e.pool.Prop(t, arch[0], record.PropKeyID))
	must.FileExists(t, record.KeyPath(keys, id))
	second := tenant(2, 0)
	a.hold("scratch-0", second)
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	must.Eq(t, "tenant "+first.AllocID, readData(t, res[0]))
	must.Eq(t, id, e.pool.Prop(t, res[0].Dataset, record.PropKeyID))
	a.start(second)

	// Destroyed at release: the key goes after the dataset, and the
	// ciphertext copied before cannot be opened.
	third := tenant(3, 0)
	tmp := reserveAndWrite(t, e, a, "temp-0", third)
	tmpID := e.pool.Prop(t, tmp.Dataset, record.PropKeyID)
	copy := e.pool.Dataset("copy-temp")
	rawCopy(t, e, tmp.Dataset, copy)
	a.end(third)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	for _, s := range e.mgr.Slots() {
		if s.ID == "temp-0" {
			must.NotEq(t, tmpID, e.pool.Prop(t, s.Dataset, record.PropKeyID), must.Sprint("a fresh dataset, with a key of its own"))
		}
	}
	must.FileNotExists(t, record.KeyPath(keys, tmpID))
	err = loadKey(e, copy, record.KeyPath(keys, tmpID))
	must.Error(t, err, must.Sprint("the raw copy cannot be opened once the key is gone"))

	// Pruned by retention: the archive, then its key.
	a.end(second)
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	arch = archived(t, e)
	must.SliceLen(t, 1, arch)
	copy2 := e.pool.Dataset("copy-arch")
	rawCopy(t, e, arch[0], copy2)
	pruner.SetConfig(retention.Config{Container: e.cfg.ArchiveDataset(), KeyDir: keys,
		Rules: retention.Rules{Default: retention.Policy{Keep: 1, MaxAge: time.Nanosecond}}})
	_, err = pruner.Pass(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, archived(t, e))
	must.FileNotExists(t, record.KeyPath(keys, id))
	must.Error(t, loadKey(e, copy2, record.KeyPath(keys, id)))

	// Only the keys of datasets that exist are left.
	var live []string
	for _, line := range strings.Split(strings.TrimSpace(e.pool.ZFS(t, "get", "-H", "-r", "-o", "value", record.PropKeyID, e.cfg.Parent)), "\n") {
		if record.ValidKeyID(line) {
			live = append(live, line+".key")
		}
	}
	must.SliceContainsAll(t, live, keyFiles(t, keys))

	// Encryption turned off: the free datasets are made again, plain, and
	// the keys of those destroyed go with them.
	for i := range e.cfg.Classes {
		e.cfg.Classes[i].Encrypted = false
	}
	e.mgr.SetConfig(e.cfg)
	for _, s := range e.sync(t) {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
		must.Eq(t, "off", e.pool.Prop(t, s.Dataset, "encryption"))
	}
	must.SliceEmpty(t, keyFiles(t, keys))
}
