package shared_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// fingerprint is what must not change about the operator's dataset: every
// property and its source but the space figures, which move as ZFS commits
// the test's own writes.
func fingerprint(t *testing.T, pool *zfstest.Pool, ds string) string {
	t.Helper()
	var keep []string
	for _, line := range strings.Split(pool.ZFS(t, "get", "-H", "-p", "-o", "property,value,source", "all", ds), "\n") {
		prop, _, _ := strings.Cut(line, "\t")
		switch {
		case prop == "used", prop == "available", prop == "referenced", prop == "written",
			prop == "compressratio", prop == "refcompressratio",
			strings.HasPrefix(prop, "usedby"), strings.HasPrefix(prop, "logical"):
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}

// TestSet_RealPool reads operator datasets on a real pool: a healthy one,
// one unmounted, one missing and one whose mountpoint would expose the
// parent. Each class's fault stays its own, and nothing the set does
// changes the operator's datasets.
func TestSet_RealPool(t *testing.T) {
	pool := zfstest.NewPool(t, 256<<20)
	models, cache, gone, wide := pool.Dataset("models"), pool.Dataset("cache"), pool.Dataset("gone"), pool.Dataset("wide")
	pool.ZFS(t, "create", models)
	pool.ZFS(t, "create", cache)
	pool.ZFS(t, "create", wide)
	// The parent is mounted inside "wide": a task given "wide" would see
	// every slot.
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", "-o", "mountpoint="+pool.Prop(t, wide, "mountpoint")+"/nomad", parent)
	mp := pool.Prop(t, models, "mountpoint")
	must.NoError(t, os.WriteFile(filepath.Join(mp, "weights.bin"), []byte("the operator's model"), 0o644))
	before := fingerprint(t, pool, models)

	set := shared.NewSet(zfs.NewClient(pool.Runner))
	classes := []shared.Class{
		{Name: "models", Dataset: models, Slots: 3, MountPath: "/models", ReadOnly: true},
		{Name: "cache", Dataset: cache, Slots: 1, MountPath: "/cache", ReadOnly: true},
		{Name: "gone", Dataset: gone, Slots: 1, MountPath: "/gone", ReadOnly: true},
		{Name: "wide", Dataset: wide, Slots: 1, MountPath: "/wide", ReadOnly: true},
	}
	set.SetConfig(parent, nil, classes)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pool.ZFS(t, "unmount", cache)
	set.Refresh(ctx)
	why := map[string]string{}
	for _, st := range set.States() {
		why[st.Class.Name] = st.Why
		must.Eq(t, st.Why == "", st.Healthy, must.Sprint(st.Class.Name))
	}
	must.Eq(t, "", why["models"])
	must.StrContains(t, why["cache"], "is not mounted")
	must.StrContains(t, why["gone"], "does not exist")
	must.StrContains(t, why["wide"], "holds the plugin's parent dataset")

	st, err := set.Reserve(ctx, []string{"models-0", "models-2"})
	must.NoError(t, err)
	must.Eq(t, mp, st.Mountpoint)
	b, err := os.ReadFile(filepath.Join(st.Mountpoint, "weights.bin"))
	must.NoError(t, err)
	must.Eq(t, "the operator's model", string(b))

	_, err = set.Reserve(ctx, []string{"cache-0"})
	must.ErrorIs(t, err, shared.ErrUnhealthy)
	must.ErrorContains(t, err, `class "cache"`)
	must.ErrorContains(t, err, "is not mounted")
	_, err = set.Reserve(ctx, []string{"models-0", "cache-0"})
	must.ErrorContains(t, err, "not of one shared class")
	_, err = set.Reserve(ctx, []string{"models-3"})
	must.ErrorContains(t, err, `unknown device ID "models-3"`)

	// The operator mounts it again: healthy at the next read, and a
	// Reserve that finds it so signals the change.
	pool.ZFS(t, "mount", cache)
	_, err = set.Reserve(ctx, []string{"cache-0"})
	must.NoError(t, err)
	select {
	case <-set.Changed():
	default:
		t.Fatal("a Reserve that found the class healthy again did not signal a change")
	}
	// Unmounted after the last read: Reserve reads again and refuses.
	pool.ZFS(t, "unmount", models)
	_, err = set.Reserve(ctx, []string{"models-1"})
	must.ErrorIs(t, err, shared.ErrUnhealthy)
	pool.ZFS(t, "mount", models)

	must.Eq(t, before, fingerprint(t, pool, models))
}

// TestSet_PrivatePathThroughASymlink (red team): key_dir or backup_dir
// named by a path that goes through a symlink into a shared dataset's
// mountpoint. The check compared the strings only, so the class stayed
// healthy, and every task holding it would have seen the plugin's keys or
// backups. The paths are resolved first, also when the last components do
// not exist yet (the plugin makes them when it starts).
func TestSet_PrivatePathThroughASymlink(t *testing.T) {
	pool := zfstest.NewPool(t, 256<<20)
	models := pool.Dataset("models")
	pool.ZFS(t, "create", "-o", "setuid=off", "-o", "devices=off", models)
	mp := pool.Prop(t, models, "mountpoint")
	must.NoError(t, os.MkdirAll(filepath.Join(mp, "plugin"), 0o700))
	host := t.TempDir()
	link := filepath.Join(host, "lib")
	must.NoError(t, os.Symlink(filepath.Join(mp, "plugin"), link))
	classes := []shared.Class{{Name: "models", Dataset: models, Slots: 1, MountPath: "/models", ReadOnly: true}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name    string
		private string
		wantWhy string
	}{
		{"elsewhere", filepath.Join(host, "keys"), ""},
		{"through the link, existing", link, "holds " + link},
		{"through the link, not made yet", filepath.Join(link, "backups", "nomad-device-zfs"), "holds " + filepath.Join(link, "backups", "nomad-device-zfs")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := shared.NewSet(zfs.NewClient(pool.Runner))
			set.SetConfig(pool.Dataset("nomad"), []string{tc.private}, classes)
			set.Refresh(ctx)
			st := set.States()
			must.SliceLen(t, 1, st)
			if tc.wantWhy == "" {
				must.True(t, st[0].Healthy, must.Sprint(st[0].Why))
				return
			}
			must.False(t, st[0].Healthy)
			must.StrContains(t, st[0].Why, tc.wantWhy)
			must.StrContains(t, st[0].Why, "the plugin's own")
		})
	}
}
