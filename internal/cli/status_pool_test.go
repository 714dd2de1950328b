package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
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

// With backup_dir in the agent's configuration, status shows per identity
// of the classes that back up the newest backup's release, age and size
// and the chain that restores it (here: a full stream and an increment),
// read from backup_dir's manifests; a chain whose base is gone is flagged
// BROKEN, with why; an identity of a class this node does not back up is
// left out, and a file that is not a backup is counted.
func TestStatus_Backups(t *testing.T) {
	pool, parent, names := archivesOnPool(t)
	dir := t.TempDir()
	k := backup.NewKeeper(zfs.NewClient(pool.Runner), hclog.NewNullLogger())
	k.SetConfig(backup.Config{Dir: dir, Container: parent + "/.archive", Classes: map[string]bool{"state": true}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Three archives of one identity, each sent whole, the newest last;
	// then the newest comes back to the identity and goes again: an
	// increment on it.
	first, _, err := k.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, len(names), first)
	pool.ZFS(t, "set", record.PropBackup+"="+record.BackupNone, names[0])
	sent, _, err := k.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	inc := sent[0]
	full := first[len(first)-1]
	must.EqOp(t, full.GUID, inc.BaseGUID)

	// A broken chain (its base is in no manifest) of another identity of
	// the class, one of a class this node does not back up, and a file
	// that is not a backup.
	broken := retention.Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Index: 0, Class: "state"}
	writeManifest(t, dir, backup.Manifest{Identity: broken, GUID: 77, BaseGUID: 76, Size: 4096, ReleasedAt: time.Now().Add(-3 * time.Hour)})
	writeManifest(t, dir, backup.Manifest{Identity: retention.Identity{Namespace: "default", Job: "x", Group: "g", Task: "t", Class: "other"}, GUID: 5, Size: 1})
	must.NoError(t, os.WriteFile(filepath.Join(backup.IdentityDir(dir, broken), "junk.json"), []byte("{"), 0o600))

	cfgFile := backupConfig(t, parent, dir)

	var out, errb bytes.Buffer
	code := Main([]string{"status", "-json", "-address", deadAddress, "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	var r statusReport
	must.NoError(t, json.Unmarshal(out.Bytes(), &r))
	must.NotNil(t, r.Backups)
	b := *r.Backups
	must.EqOp(t, dir, b.Dir)
	must.EqOp(t, "", b.Error)
	must.SliceLen(t, 2, b.Identities, must.Sprint("the class this node does not back up is left out"))
	must.EqOp(t, 1, b.Broken)
	must.EqOp(t, 1, b.Problems)
	must.EqOp(t, len(first)+1+1, b.Streams)
	var bytesWant int64 = 4096
	for _, m := range append(first, inc) {
		bytesWant += m.Size
	}
	must.EqOp(t, bytesWant, b.Bytes)

	bad, web := b.Identities[0], b.Identities[1] // by identity: default/db before default/web
	must.Eq(t, broken, bad.Identity)
	must.False(t, bad.OK)
	must.StrContains(t, bad.Error, "snapshot GUID 76")
	must.EqOp(t, 0, bad.Streams)
	must.EqOp(t, int64(4096), bad.NewestBytes)
	must.Eq(t, inc.Identity, web.Identity)
	must.True(t, web.OK)
	must.EqOp(t, 2, web.Streams)
	must.EqOp(t, full.Size+inc.Size, web.Bytes)
	must.EqOp(t, inc.Size, web.NewestBytes)
	must.True(t, inc.ReleasedAt.Equal(web.ReleasedAt))

	out.Reset()
	code = Main([]string{"status", "-address", deadAddress, "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	text := out.String()
	must.StrContains(t, text, fmt.Sprintf("backup_dir %s: 2 identities backed up, 5 streams, ", dir))
	must.StrContains(t, text, "BROKEN chains: 1 (a restore of those fails); not sound backups: 1 file")
	var header, webRow, badRow string
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "IDENTITY "):
			header = line
		case strings.HasPrefix(line, "default/web/g[0]/t (state) "):
			webRow = line
		case strings.HasPrefix(line, "default/db/g[0]/t (state) "):
			badRow = line
		}
	}
	must.NotEq(t, "", header, must.Sprint(text))
	must.Eq(t, []string{"default/web/g[0]/t", "(state)", inc.ReleasedAt.UTC().Format(time.RFC3339), "at", "release", "1h"}, strings.Fields(webRow)[:6],
		must.Sprint(text))
	must.StrContains(t, webRow, "2 streams")
	must.StrHasSuffix(t, "ok", webRow)
	must.StrHasSuffix(t, "BROKEN", badRow)
	must.EqOp(t, strings.Index(header, "CHECK"), strings.Index(webRow, "ok"), must.Sprint("aligned:\n", text))
	must.StrContains(t, text, "BROKEN chain of default/db/g[0]/t (state): the chain of ")

	// Without backup_dir (no -config): no backups section.
	out.Reset()
	code = Main([]string{"status", "-json", "-address", deadAddress, "-parent", parent}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	r = statusReport{}
	must.NoError(t, json.Unmarshal(out.Bytes(), &r))
	must.Nil(t, r.Backups)
}

// writeManifest writes m (a manifest with no stream of its own) into its
// identity's directory in dir, as the plugin's would read.
// backupConfig writes an agent configuration whose plugin block has parent
// and backup_dir dir, with class "state" (1 slot, restore on), and
// returns its path.
func backupConfig(t *testing.T, parent, dir string) string {
	t.Helper()
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
plugin "nomad-device-zfs" {
  config {
    parent_dataset = %q
    backup_dir     = %q
    class "state" {
      slots   = 1
      quota   = "64M"
      restore = "required"
    }
  }
}
`, parent, dir)), 0o644))
	return cfgFile
}

func writeManifest(t *testing.T, dir string, m backup.Manifest) {
	t.Helper()
	m.Kind, m.Version = backup.Kind, 1
	m.Stream = fmt.Sprintf("%d.zstream", m.GUID)
	m.SHA256 = strings.Repeat("0", 64)
	if m.Created.IsZero() {
		m.Created = time.Now()
	}
	d := backup.IdentityDir(dir, m.Identity)
	must.NoError(t, os.MkdirAll(d, 0o700))
	b, err := json.Marshal(m)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(filepath.Join(d, fmt.Sprintf("%d.json", m.GUID)), b, 0o600))
}
