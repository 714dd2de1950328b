package cli

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestTreeChecks_RealPools judges the pool, the parent and the slots of
// real pools set up as an operator might get them wrong.
func TestTreeChecks_RealPools(t *testing.T) {
	type want struct{ status, has string }
	cases := []struct {
		name      string
		poolSize  int64
		nslots    int
		quota     uint64
		sync      bool                                               // let the plugin's manager create the slots
		edit      func(t *testing.T, p *zfstest.Pool, parent string) // after the sync
		pool      want
		parent    want
		slotsWant want
	}{
		{
			name: "everything right", poolSize: 1 << 30, nslots: 2, quota: 64 << 20, sync: true,
			pool:      want{checkOK, "their quotas add up to 128.0 MiB"},
			parent:    want{checkOK, "everything under it is the plugin's"},
			slotsWant: want{checkOK, "2 slots: 2 free, 0 in use, 0 releasing"},
		},
		{
			name: "slots not created yet", poolSize: 1 << 30, nslots: 2, quota: 64 << 20,
			pool:      want{checkOK, ""},
			parent:    want{checkOK, ""},
			slotsWant: want{checkWarn, "2 not created yet"},
		},
		{
			name: "over-committed", poolSize: 512 << 20, nslots: 4, quota: 256 << 20, sync: true,
			pool:      want{checkWarn, "over-committed"},
			parent:    want{checkOK, ""},
			slotsWant: want{checkOK, "4 slots: 4 free"},
		},
		{
			name: "a quota larger than the pool", poolSize: 256 << 20, nslots: 1, quota: 1 << 30, sync: true,
			pool:      want{checkFail, "free slots scratch-0 are not offered"},
			parent:    want{checkOK, ""},
			slotsWant: want{checkWarn, "scratch-0: pool "},
		},
		{
			name: "a dataset of the operator's and an unmounted slot", poolSize: 1 << 30, nslots: 2, quota: 64 << 20, sync: true,
			edit: func(t *testing.T, p *zfstest.Pool, parent string) {
				p.ZFS(t, "create", parent+"/mine")
				p.ZFS(t, "unmount", parent+"/scratch/1")
			},
			pool:      want{checkOK, ""},
			parent:    want{checkWarn, "1 datasets not the plugin's (left alone): "},
			slotsWant: want{checkWarn, "scratch-1: dataset "},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := zfstest.NewPool(t, tc.poolSize)
			parent := pool.Dataset("nomad")
			pool.ZFS(t, "create", parent)
			cfg := slots.Config{Parent: parent, Classes: []slots.Class{{
				Name: "scratch", Slots: tc.nslots, Quota: tc.quota, UID: 65534, GID: 65534, Mode: 0o770,
			}}}
			z := zfs.NewClient(&zfs.Runner{})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if tc.sync {
				mgr := slots.NewManager(z, hclog.NewNullLogger())
				mgr.SetConfig(cfg)
				must.NoError(t, mgr.Sync(ctx))
				must.NoError(t, mgr.Wait(ctx))
			}
			if tc.edit != nil {
				tc.edit(t, pool, parent)
			}
			obs, err := view.Observe(ctx, z, cfg)
			must.NoError(t, err)
			got := map[string]check{}
			for _, c := range treeChecks(cfg, obs) {
				got[c.Name] = c
			}
			for name, w := range map[string]want{"pool": tc.pool, "parent": tc.parent, "slots": tc.slotsWant} {
				c := got[name]
				must.EqOp(t, w.status, c.Status, must.Sprintf("%s: %s", name, c.Message))
				must.StrContains(t, c.Message, w.has, must.Sprint(name))
				must.EqOp(t, c.Status != checkOK, c.Fix != "", must.Sprintf("%s: a fix exactly when not ok", name))
			}
		})
	}
}

// The pool gone and the parent missing, as doctor reads them.
func TestTreeChecks_PoolAndParentGone(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	cfg := slots.Config{Parent: pool.Dataset("nope"), Classes: []slots.Class{{Name: "scratch", Slots: 1, Quota: 1 << 20}}}
	z := zfs.NewClient(&zfs.Runner{})
	ctx := context.Background()

	obs, err := view.Observe(ctx, z, cfg)
	must.NoError(t, err)
	cs := treeChecks(cfg, obs)
	must.EqOp(t, checkFail, cs[1].Status)
	must.EqOp(t, "parent", cs[1].Name)
	must.StrContains(t, cs[1].Fix, "zfs create "+cfg.Parent)
	must.EqOp(t, checkSkip, cs[2].Status)

	gone := cfg
	gone.Parent = "ndznosuchpool/nomad"
	obs, err = view.Observe(ctx, z, gone)
	must.NoError(t, err)
	cs = treeChecks(gone, obs)
	must.EqOp(t, checkFail, cs[0].Status)
	must.StrContains(t, cs[0].Message, "pool ndznosuchpool is not imported")
	must.StrContains(t, cs[0].Fix, "zpool import ndznosuchpool")
	must.EqOp(t, checkSkip, cs[1].Status)
	must.EqOp(t, checkSkip, cs[2].Status)
}

// Two plugin blocks, a bad flag, a -parent that disagrees: the config
// line fails and says what to do about that very thing.
func TestDoctorConfigLine(t *testing.T) {
	dir := t.TempDir()
	block := func(parent string) string {
		return `plugin "nomad-device-zfs" {
  config {
    parent_dataset = "` + parent + `"
    class "scratch" {
      slots = 1
      quota = "1M"
    }
  }
}
`
	}
	one := filepath.Join(dir, "one.hcl")
	must.NoError(t, os.WriteFile(one, []byte(block("tank/a")), 0o644))
	two := filepath.Join(dir, "two.hcl")
	must.NoError(t, os.WriteFile(two, []byte(block("tank/b")), 0o644))

	cases := []struct {
		name           string
		c              common
		msgHas, fixHas string
	}{
		{name: "two blocks", c: common{configs: []string{one, two}}, msgHas: "2 plugin \"nomad-device-zfs\" blocks", fixHas: "keep exactly one"},
		{name: "bad -address", c: common{configs: []string{one}, address: "127.0.0.1:4646"}, msgHas: "-address=127.0.0.1:4646: want a URL", fixHas: "correct the flag"},
		{name: "bad -node-id", c: common{configs: []string{one}, nodeID: "node1"}, msgHas: "-node-id=node1", fixHas: "correct the flag"},
		{name: "-parent disagrees", c: common{configs: []string{one}, parent: "tank/b"}, msgHas: `-parent=tank/b differs from parent_dataset "tank/a"`, fixHas: "leave it out"},
		{name: "no -config nor -parent", c: common{}, msgHas: "give -config", fixHas: "point -config"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			d := &doctor{c: &c, z: zfs.NewClient(&zfs.Runner{})}
			d.loadErr = c.load(context.Background(), d.z)
			d.checkConfig()
			must.SliceLen(t, 1, d.checks)
			must.EqOp(t, checkFail, d.checks[0].Status)
			must.StrContains(t, d.checks[0].Message, tc.msgHas)
			must.StrContains(t, d.checks[0].Fix, tc.fixHas)
		})
	}
}
