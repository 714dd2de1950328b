package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// deadAddress is an API address where nothing listens.
const deadAddress = "http://127.0.0.1:1"

// slotsOnPool makes a pool whose parent holds the plugin's slots, as a
// running plugin leaves them: two scratch slots (one reserved and owned)
// and a dataset of the operator's. It returns the pool and the parent.
func slotsOnPool(t *testing.T) (*zfstest.Pool, string) {
	t.Helper()
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	cfg := slots.Config{Parent: parent, Classes: []slots.Class{{
		Name: "scratch", Slots: 2, Quota: 64 << 20, UID: 65534, GID: 65534, Mode: 0o770,
	}}}
	mgr := slots.NewManager(zfs.NewClient(&zfs.Runner{}), hclog.NewNullLogger())
	mgr.SetConfig(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must.NoError(t, mgr.Sync(ctx))
	t.Cleanup(func() { _ = mgr.Wait(context.Background()) })
	ds := parent + "/scratch/1"
	owner := record.Owner{AllocID: "7f3e2a10-1b2c-4d5e-8f90-a1b2c3d4e5f6", Namespace: "web", Job: "build\tnightly", Group: "ci", Task: "make"}
	pool.ZFS(t, "set", record.PropState+"="+string(record.StateReserved), ds)
	pool.ZFS(t, "set", record.PropOwner+"="+owner.Encode(), ds)
	pool.ZFS(t, "create", parent+"/mine")
	return pool, parent
}

// status works from ZFS alone: with Nomad down it lists every slot, with
// the holder recorded on the dataset, and says that Nomad was not read;
// -parent finds the classes without the agent's configuration.
func TestStatus_RealPoolWithoutNomad(t *testing.T) {
	pool, parent := slotsOnPool(t)
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
plugin "nomad-device-zfs" {
  config {
    parent_dataset = %q
    class "scratch" {
      slots = 2
      quota = "64M"
    }
  }
}
`, parent)), 0o644))

	for _, args := range [][]string{
		{"-config", cfgFile},
		{"-parent", parent},
	} {
		t.Run(args[0], func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(append([]string{"status", "-json", "-address", deadAddress}, args...), &out, &errb)
			must.EqOp(t, 0, code, must.Sprint(errb.String()))
			var r statusReport
			must.NoError(t, json.Unmarshal(out.Bytes(), &r))
			must.False(t, r.Nomad.Read)
			must.StrContains(t, r.Nomad.Error, "127.0.0.1:1")
			must.EqOp(t, "ONLINE", r.Pool.Health)
			must.NotNil(t, r.Pool.AvailableBytes)
			must.Eq(t, []string{parent + "/mine"}, r.Foreign)
			must.SliceLen(t, 2, r.Slots)
			must.EqOp(t, stateFree, r.Slots[0].State)
			must.EqOp(t, stateInUse, r.Slots[1].State)
			must.NotNil(t, r.Slots[1].Holder)
			must.EqOp(t, "build\tnightly", r.Slots[1].Holder.Job)
			must.True(t, r.Slots[1].Holder.Recorded)
			must.EqOp(t, uint64(64<<20), r.Slots[1].QuotaBytes)
			must.Eq(t, []classSummary{{Name: "scratch", Slots: 2, QuotaBytes: 64 << 20, Free: 1, InUse: 1}}, r.Classes)

			out.Reset()
			code = Main(append([]string{"status", "-address", deadAddress}, args...), &out, &errb)
			must.EqOp(t, 0, code)
			must.StrContains(t, out.String(), "scratch-1  "+parent+"/scratch/1  in use  web/build\\tnightly/ci/make  7f3e2a10  ")
			must.StrContains(t, out.String(), "states and holders are what ZFS records")
		})
	}

	// Nothing changed on the pool: status only reads.
	must.EqOp(t, string(record.StateReserved), pool.Prop(t, parent+"/scratch/1", record.PropState))
	must.EqOp(t, "", pool.Prop(t, parent+"/mine", record.PropManaged))
}

func TestStatus_ParentWithoutClasses(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("empty")
	pool.ZFS(t, "create", parent)
	var out, errb bytes.Buffer
	code := Main([]string{"status", "-parent", parent, "-address", deadAddress}, &out, &errb)
	must.EqOp(t, 1, code)
	must.StrContains(t, errb.String(), "no class of nomad-device-zfs under "+parent)
}

// status shows each shared class from the agent's configuration: its
// dataset, whether it can be handed out and why not; it changes nothing.
func TestStatus_SharedClasses(t *testing.T) {
	pool, parent := slotsOnPool(t)
	models, gone := pool.Dataset("models"), pool.Dataset("gone")
	pool.ZFS(t, "create", models)
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
plugin "nomad-device-zfs" {
  config {
    parent_dataset = %q
    class "scratch" {
      slots = 2
      quota = "64M"
    }
    class "models" {
      shared  = true
      dataset = %q
      slots   = 4
    }
    class "weights" {
      shared  = true
      dataset = %q
      slots   = 1
    }
  }
}
`, parent, models, gone)), 0o644))

	var out, errb bytes.Buffer
	code := Main([]string{"status", "-json", "-address", deadAddress, "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	var r statusReport
	must.NoError(t, json.Unmarshal(out.Bytes(), &r))
	must.SliceLen(t, 2, r.Shared)
	must.Eq(t, sharedSummary{Name: "models", Dataset: models, Mountpoint: pool.Prop(t, models, "mountpoint"), Slots: 4,
		ReadOnly: true, Healthy: true, UsedBytes: r.Shared[0].UsedBytes}, r.Shared[0])
	must.Positive(t, r.Shared[0].UsedBytes)
	must.False(t, r.Shared[1].Healthy)
	must.StrContains(t, r.Shared[1].Reason, "does not exist")
	must.Nil(t, r.Shared[1].InUse, must.Sprint("Nomad was not read: no count"))

	out.Reset()
	code = Main([]string{"status", "-address", deadAddress, "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	must.StrContains(t, out.String(), "shared class models: "+models+" (read-only, ")
	must.StrContains(t, out.String(), "4 slots: healthy\n")
	must.StrContains(t, out.String(), "shared class weights: "+gone+" (read-only, 0 B used), 1 slot: unhealthy: shared dataset "+gone+": does not exist")
}
