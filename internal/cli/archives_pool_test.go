package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// archivesOnPool makes a pool whose archive holds three archives of one
// identity (web.g[0]/t, class state), released 1, 2 and 3 hours ago, and
// a dataset of the operator's; it returns the pool, the parent and the
// archives' names, newest first.
func archivesOnPool(t *testing.T) (*zfstest.Pool, string, []string) {
	t.Helper()
	pool := zfstest.NewPool(t, 0)
	cfg := slots.Config{Parent: pool.Dataset("nomad")}
	pool.ZFS(t, "create", cfg.Parent)
	pool.ZFS(t, "create", "-o", record.PropManaged+"="+record.ManagedArchive, "-o", "canmount=noauto", cfg.ArchiveDataset())
	pool.ZFS(t, "create", "-o", record.PropManaged+"="+record.ManagedClass, cfg.ClassDataset("state"))
	o := record.Owner{AllocID: "7f3e2a10-1b2c-4d5e-8f90-a1b2c3d4e5f6", Namespace: "default", Job: "web", Group: "g", Task: "t", AllocName: "web.g[0]"}
	now := time.Now().UTC()
	var names []string
	for h := 1; h <= 3; h++ {
		o.AllocID = fmt.Sprintf("7f3e2a1%d-1b2c-4d5e-8f90-a1b2c3d4e5f6", h) // one allocation each
		name := record.ArchivedName(cfg.ArchiveDataset(), "state", 0, o, now.Add(-time.Duration(h)*time.Hour))
		pool.ZFS(t, "create", "-o", "canmount=noauto", "-o", record.PropManaged+"="+record.ManagedSlot,
			"-o", record.PropState+"="+string(record.StateArchived), "-o", record.PropOwner+"="+o.Encode(), name)
		names = append(names, name)
	}
	pool.ZFS(t, "create", cfg.ArchiveDataset()+"/notes")
	return pool, cfg.Parent, names
}

func TestArchivesAndPrune_RealPool(t *testing.T) {
	pool, parent, names := archivesOnPool(t)
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
plugin "nomad-device-zfs" {
  config {
    parent_dataset = %q
    class "state" {
      slots = 1
      quota = "64M"
      keep  = 1
    }
  }
}
`, parent)), 0o644))
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String(), errb.String()
	}

	// archives: newest first, the two older ones marked for "keep".
	code, out, errs := run("archives", "-json", "-config", cfgFile)
	must.EqOp(t, 0, code, must.Sprint(errs))
	var r archivesReport
	must.NoError(t, json.Unmarshal([]byte(out), &r))
	must.True(t, r.RulesKnown)
	must.SliceLen(t, 3, r.Archives)
	for i, a := range r.Archives {
		must.Eq(t, names[i], a.Name)
		must.Eq(t, "local", a.Where)
		must.Eq(t, "default/web/g[0]/t (state)", a.Identity.String())
		if i == 0 {
			must.Nil(t, a.Prune)
		} else {
			must.Eq(t, "keep", a.Prune.Rule)
		}
	}
	must.SliceLen(t, 1, r.Skipped)
	must.StrHasSuffix(t, "/notes", r.Skipped[0].Name)

	// Without -config the rules are unknown, and said to be.
	code, out, errs = run("archives", "-parent", parent)
	must.EqOp(t, 0, code, must.Sprint(errs))
	must.StrContains(t, out, "PRUNE is ? without -config")
	code, _, errs = run("prune", "-dry-run", "-parent", parent)
	must.EqOp(t, exitUsage, code)
	must.StrContains(t, errs, "prune needs -config")

	// prune -dry-run deletes nothing and says what it would.
	code, out, errs = run("prune", "-dry-run", "-config", cfgFile)
	must.EqOp(t, 0, code, must.Sprint(errs))
	must.StrContains(t, out, "Would delete 2 archives of 3")
	must.StrContains(t, out, names[2])
	for _, n := range names {
		must.Eq(t, "archived", pool.Prop(t, n, record.PropState))
	}

	// prune deletes them.
	code, out, errs = run("prune", "-config", cfgFile)
	must.EqOp(t, 0, code, must.Sprint(errs))
	must.StrContains(t, out, "Deleted 2 archives")
	left := pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", parent+"/.archive")
	must.Eq(t, []string{parent + "/.archive", parent + "/.archive/notes", names[0]}, sortedFields(left))
}

func sortedFields(s string) []string {
	f := strings.Fields(s)
	sort.Strings(f)
	return f
}

func TestBackupsVerify_RealPool(t *testing.T) {
	pool, parent, names := archivesOnPool(t)
	dir, sent := sentToBackupDir(t, pool, parent, len(names))

	cfgFile := backupConfig(t, parent, dir)
	var out, errb bytes.Buffer
	code := Main([]string{"backups", "verify", "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String(), out.String()))
	must.StrContains(t, out.String(), "3 streams, 1 identity")
	must.StrContains(t, out.String(), "All streams match")
	// Per identity, the newest backup's age and the chain that restores it.
	newest := sent[len(sent)-1]
	must.StrContains(t, out.String(), "NEWEST BACKUP")
	must.StrContains(t, out.String(), newest.ReleasedAt.UTC().Format(time.RFC3339))
	must.StrContains(t, out.String(), "1 stream")
	out.Reset()
	code = Main([]string{"backups", "verify", "-json", "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	var vr backupsReport
	must.NoError(t, json.Unmarshal(out.Bytes(), &vr))
	must.SliceLen(t, 1, vr.Chains)
	c := vr.Chains[0]
	must.True(t, newest.ReleasedAt.Equal(c.ReleasedAt), must.Sprintf("%v, want %v", c.ReleasedAt, newest.ReleasedAt))
	must.True(t, newest.Created.Equal(c.NewestCreated), must.Sprintf("%v, want %v", c.NewestCreated, newest.Created))
	c.ReleasedAt, c.NewestCreated = time.Time{}, time.Time{}
	must.Eq(t, chainRow{Identity: newest.Identity, NewestBytes: newest.Size, Streams: 1, Bytes: newest.Size, OK: true}, c)

	// archives says where each is: here and in backup_dir; and an identity
	// with a backup but no archive here shows its newest backup.
	pool.ZFS(t, "destroy", "-r", names[0])
	out.Reset()
	code = Main([]string{"archives", "-json", "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	var ar archivesReport
	must.NoError(t, json.Unmarshal(out.Bytes(), &ar))
	must.SliceLen(t, 2, ar.Archives)
	for _, a := range ar.Archives {
		must.Eq(t, "local, backup_dir", a.Where)
	}
	pool.ZFS(t, "destroy", "-r", names[1])
	pool.ZFS(t, "destroy", "-r", names[2])
	out.Reset()
	code = Main([]string{"archives", "-json", "-config", cfgFile}, &out, &errb)
	must.EqOp(t, 0, code, must.Sprint(errb.String()))
	ar = archivesReport{}
	must.NoError(t, json.Unmarshal(out.Bytes(), &ar))
	must.SliceLen(t, 1, ar.Archives)
	must.Eq(t, "backup_dir", ar.Archives[0].Where)
	must.Eq(t, sent[len(sent)-1].StreamPath(), ar.Archives[0].Name)
	out.Reset()

	// One byte changed in one stream: found, named, exit 1.
	b, err := os.ReadFile(sent[1].StreamPath())
	must.NoError(t, err)
	b[len(b)/2] ^= 1
	must.NoError(t, os.WriteFile(sent[1].StreamPath(), b, 0o600))
	out.Reset()
	code = Main([]string{"backups", "verify", "-json", "-config", cfgFile}, &out, &errb)
	must.EqOp(t, exitFailed, code)
	var r backupsReport
	must.NoError(t, json.Unmarshal(out.Bytes(), &r))
	must.Eq(t, 1, r.Bad)
	for _, s := range r.Streams {
		must.Eq(t, s.Path != sent[1].StreamPath(), s.OK)
	}

	// Without a backup_dir there is nothing to verify: a usage error.
	code = Main([]string{"backups", "verify", "-parent", parent}, &out, &errb)
	must.EqOp(t, exitUsage, code)
}

// TestBackupsSetAside_RealPool: an identity whose data forked at its
// newest backup (an older allocation's data came from the newest's: the
// newest is a late release) is FORKED in backups verify, which exits 1; backups
// set-aside of one fork's allocation resolves it (verify exits 0, the
// newest shown is the other fork's), -undo takes it back, and an
// allocation backup_dir holds nothing of is an error naming it.
func TestBackupsSetAside_RealPool(t *testing.T) {
	pool, parent, names := archivesOnPool(t)
	// The oldest allocation's data went to the late one, which a
	// successor restored from (an earlier backup of it) and which was
	// released after it.
	lateAlloc, successorAlloc, firstAlloc := "7f3e2a11-1b2c-4d5e-8f90-a1b2c3d4e5f6", "7f3e2a12-1b2c-4d5e-8f90-a1b2c3d4e5f6", "7f3e2a13-1b2c-4d5e-8f90-a1b2c3d4e5f6"
	pool.ZFS(t, "set", record.PropDataFrom+"="+firstAlloc, names[0])
	pool.ZFS(t, "set", record.PropDataFrom+"="+lateAlloc+","+firstAlloc, names[1])
	dir, sent := sentToBackupDir(t, pool, parent, len(names))
	cfgFile := backupConfig(t, parent, dir)
	verify := func(wantCode int) chainRow {
		t.Helper()
		var out, errb bytes.Buffer
		code := Main([]string{"backups", "verify", "-json", "-config", cfgFile}, &out, &errb)
		must.EqOp(t, wantCode, code, must.Sprint(errb.String()))
		var r backupsReport
		must.NoError(t, json.Unmarshal(out.Bytes(), &r))
		must.SliceLen(t, 1, r.Chains)
		return r.Chains[0]
	}
	setAside := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(append([]string{"backups", "set-aside", "-config", cfgFile}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	c := verify(exitFailed)
	must.EqOp(t, successorAlloc, c.ForkedWith)
	var out, errb bytes.Buffer
	Main([]string{"backups", "verify", "-config", cfgFile}, &out, &errb)
	must.StrContains(t, out.String(), "FORKED with "+successorAlloc)

	// A restore waiting for the data of an allocation that never came
	// names the identity's directory to set it aside in.
	neverCame := "7f3e2a14-1b2c-4d5e-8f90-a1b2c3d4e5f6"
	idDir := filepath.Base(backup.IdentityDir(dir, c.Identity))
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		has     string
		forked  string
		aside   int
		newestH int // hours ago of the newest backup shown
	}{
		{"the successor's fork set aside", []string{"-alloc", successorAlloc}, exitOK, "are set aside", "", 1, 1},
		{"taken back", []string{"-alloc", successorAlloc, "-undo"}, exitOK, "are no longer set aside", successorAlloc, 0, 1},
		{"the late release set aside: the successor's is the newest", []string{"-alloc", lateAlloc}, exitOK, "are set aside", "", 1, 2},
		{"an allocation with no backup", []string{"-alloc", "00000000-1b2c-4d5e-8f90-a1b2c3d4e5f6"}, exitFailed, "holds no backup of allocation 00000000-1b2c-4d5e-8f90-a1b2c3d4e5f6", "", 1, 2},
		{"an allocation with no backup, in the identity a restore names", []string{"-alloc", neverCame, "-identity", idDir}, exitOK, "which left no backup, is set aside", "", 1, 2},
		{"an identity that is no directory's name", []string{"-alloc", neverCame, "-identity", "../x"}, exitFailed, "is not the name of an identity's directory", "", 1, 2},
		{"not an allocation ID", []string{"-alloc", "web"}, exitFailed, `"web" is not an allocation ID`, "", 1, 2},
		{"no -alloc", nil, exitUsage, "-alloc=<id> is required", "", 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := setAside(tc.args...)
			must.EqOp(t, tc.code, code, must.Sprint(out, errs))
			must.StrContains(t, out+errs, tc.has)
			want := exitOK
			if tc.forked != "" {
				want = exitFailed
			}
			c := verify(want)
			must.EqOp(t, tc.forked, c.ForkedWith)
			must.EqOp(t, tc.aside, c.SetAside)
			must.EqOp(t, sent[len(sent)-tc.newestH].AllocID, newestAllocOf(t, dir, c))
		})
	}
	aside, err := os.ReadFile(filepath.Join(backup.IdentityDir(dir, c.Identity), backup.SetAsideFile))
	must.NoError(t, err)
	must.StrContains(t, string(aside), neverCame)
}

// newestAllocOf is the allocation of the manifest of c's newest backup.
func newestAllocOf(t *testing.T, dir string, c chainRow) string {
	t.Helper()
	ms, _, err := backup.List(dir, &c.Identity)
	must.NoError(t, err)
	for _, m := range ms {
		if m.ReleasedAt.Equal(c.ReleasedAt) {
			return m.AllocID
		}
	}
	t.Fatalf("no manifest taken at %v", c.ReleasedAt)
	return ""
}

// sentToBackupDir sends the archives under parent into a new backup_dir
// with a keeper's pass, checks that want were sent, and returns the
// directory and the manifests sent (oldest first).
func sentToBackupDir(t *testing.T, pool *zfstest.Pool, parent string, want int) (string, []backup.Manifest) {
	t.Helper()
	dir := t.TempDir()
	k := backup.NewKeeper(zfs.NewClient(pool.Runner), hclog.NewNullLogger())
	k.SetConfig(backup.Config{Dir: dir, Container: parent + "/.archive", Classes: map[string]bool{"state": true}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sent, _, err := k.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, want, sent)
	return dir, sent
}
