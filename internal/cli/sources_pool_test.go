package cli

import (
	"context"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// After the operator moves a golden class to a new snapshot, doctor's
// "sources" check and status name the slots still on the old one (here
// all: the plugin has not run since), and say nothing once none is.
func TestSources_OlderSourceListed(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent, gold := pool.Dataset("nomad"), pool.Dataset("golden")
	pool.ZFS(t, "create", parent)
	pool.ZFS(t, "create", gold)
	pool.ZFS(t, "snapshot", gold+"@v1")
	pool.ZFS(t, "snapshot", gold+"@v2")
	cfg := slots.Config{Parent: parent, Classes: []slots.Class{{Name: "ci", Slots: 2, Quota: 64 << 20, UID: 65534, GID: 65534, Mode: 0o770,
		OnRelease: slots.OnReleaseDestroy, Source: gold + "@v1"}}}
	mgr := slots.NewManager(zfs.NewClient(pool.Runner), hclog.NewNullLogger())
	mgr.SetConfig(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must.NoError(t, mgr.Sync(ctx))
	t.Cleanup(func() { _ = mgr.Wait(context.Background()) })

	cfg.Classes[0].Source = gold + "@v2"
	obs, err := view.Observe(ctx, zfs.NewClient(pool.Runner), cfg)
	must.NoError(t, err)
	c, ok := sourceCheck(cfg, obs)
	must.True(t, ok)
	must.Eq(t, checkWarn, c.Status)
	must.StrContains(t, c.Message, "class ci: fresh slots are clones of "+gold+"@v2; still on an older source: ci-0, ci-1 on "+gold+"@v1")
	must.StrContains(t, c.Fix, "destroy the old snapshot once none is listed")
	must.Eq(t, []olderSource{{Snapshot: gold + "@v1", Devices: []string{"ci-0", "ci-1"}}}, olderSources(cfg.Classes[0], obs.Slots))

	// The plugin makes them again from v2: nothing older.
	mgr.SetConfig(cfg)
	must.NoError(t, mgr.Sync(ctx))
	obs, err = view.Observe(ctx, zfs.NewClient(pool.Runner), cfg)
	must.NoError(t, err)
	c, _ = sourceCheck(cfg, obs)
	must.Eq(t, checkOK, c.Status, must.Sprint(c.Message))
	must.SliceEmpty(t, olderSources(cfg.Classes[0], obs.Slots))

	// No class with a source: no check.
	cfg.Classes[0].Source = ""
	_, ok = sourceCheck(cfg, obs)
	must.False(t, ok)
}
