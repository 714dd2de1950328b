package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		must.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	must.NoError(t, err)
	must.EqOp(t, string(want), string(got), must.Sprint("go test ./internal/cli -update rewrites "+path))
}

func u64(n uint64) *uint64 { return &n }

// sampleStatus has a slot in every state, a holder known only to Nomad, a
// job name with a TAB, and sizes from bytes to GiB.
func sampleStatus() statusReport {
	return statusReport{
		Parent: "tank/nomad",
		Pool:   poolStatus{Name: "tank", Health: "ONLINE", AvailableBytes: u64(13<<30 + 512<<20)},
		Nomad:  nomadStatus{Address: "http://127.0.0.1:4646", Read: true, NodeID: "5e1c0a3d-8f2b-4c41-9a55-2b7f6c0f9e11"},
		Classes: []classSummary{
			{Name: "fast", Slots: 1, QuotaBytes: 1 << 30, InUse: 1},
			{Name: "scratch", Slots: 4, QuotaBytes: 64 << 20, Free: 1, InUse: 1, Releasing: 1, Unhealthy: 1},
		},
		Slots: []slotRow{
			{Class: "fast", Device: "fast-0", Dataset: "tank/nomad/fast/0", State: stateInUse, UsedBytes: 700 << 20, QuotaBytes: 1 << 30,
				Holder:      &holder{Namespace: "default", Job: "etl", Group: "g", Task: "load", AllocID: "0b9d6c1e-4cde-4f07-8a1e-3c9b0f3e5d21"},
				AllocStatus: "pending"},
			{Class: "scratch", Device: "scratch-0", Dataset: "tank/nomad/scratch/0", State: stateFree, UsedBytes: 96 << 10, QuotaBytes: 64 << 20},
			{Class: "scratch", Device: "scratch-1", Dataset: "tank/nomad/scratch/1.alt", State: stateInUse, UsedBytes: 2 << 20, QuotaBytes: 64 << 20,
				Holder:      &holder{Namespace: "web", Job: "build\tnightly", Group: "ci", Task: "make", AllocID: "7f3e2a10-1b2c-4d5e-8f90-a1b2c3d4e5f6", Recorded: true},
				AllocStatus: "running", Spare: "tank/nomad/scratch/1",
				Reason: "previous dataset tank/nomad/scratch/1 on its way to the archive"},
			{Class: "scratch", Device: "scratch-2", Dataset: "tank/nomad/scratch/2", State: stateReleasing, UsedBytes: 10 << 20, QuotaBytes: 64 << 20,
				Holder:      &holder{Namespace: "default", Job: "batch", Group: "g", Task: "t", AllocID: "c4a1f9d2-0000-4000-8000-000000000000", Recorded: true},
				AllocStatus: "complete",
				Reason:      `releasing: allocation c4a1f9d2 ("default"/"batch", group "g", task "t") has ended; its dataset is being archived`},
			{Class: "scratch", Device: "scratch-3", Dataset: "tank/nomad/scratch/3", State: stateUnhealthy, UsedBytes: 512, QuotaBytes: 64 << 20,
				Reason: "dataset tank/nomad/scratch/3 is not mounted (mounted=no, mountpoint=/tank/nomad/scratch/3)"},
		},
		Foreign: []string{"tank/nomad/mine"},
		Archive: archive{Datasets: 3, UsedBytes: 123 << 20},
	}
}

// statusNow is the time status is rendered at in the golden files.
var statusNow = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// sampleBackups has an identity with a whole chain of three streams
// (older chains beside it), the newest a live backup, and one, with a TAB in its job name, whose
// newest backup's chain is broken; and a file that is not a backup.
func sampleBackups() *backupsStatus {
	db := retention.Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Index: 0, Class: "state"}
	web := retention.Identity{Namespace: "web", Job: "build\tnightly", Group: "ci", Task: "make", Index: 2, Class: "state"}
	return &backupsStatus{
		Dir: "/mnt/backups",
		Identities: []chainRow{
			{Identity: db, ReleasedAt: statusNow.Add(-25 * time.Minute), Live: true, NewestCreated: statusNow.Add(-24 * time.Minute), NewestBytes: 3 << 20,
				Streams: 3, Bytes: 1<<30 + 5<<20, OK: true},
			{Identity: web, ReleasedAt: statusNow.Add(-50 * time.Hour), NewestCreated: statusNow.Add(-50 * time.Hour), NewestBytes: 700 << 10,
				Error: "the chain of /mnt/backups/nomad-device-zfs/0a1b/20261122T100000Z-77.json is broken: its base (snapshot GUID 76) is not in backup_dir"},
		},
		Streams: 7, Bytes: 2<<30 + 12<<20, Broken: 1, Problems: 1,
	}
}

func TestRenderStatus_Golden(t *testing.T) {
	cases := []struct {
		name   string
		golden string
		edit   func(*statusReport)
	}{
		{name: "every state", golden: "status.golden", edit: func(*statusReport) {}},
		{name: "nomad down", golden: "status-nomad-down.golden", edit: func(r *statusReport) {
			r.Nomad = nomadStatus{Address: "http://127.0.0.1:4646", Error: `GET /v1/node/5e1c0a3d/allocations: dial tcp 127.0.0.1:4646: connect: connection refused`}
			for i := range r.Slots {
				r.Slots[i].AllocStatus = ""
			}
			r.Slots[0].Holder = nil
		}},
		{name: "pool not imported", golden: "status-pool-gone.golden", edit: func(r *statusReport) {
			r.Pool = poolStatus{Name: "tank", Error: "pool tank is not imported: zpool list -H -o name,health tank: cannot open 'tank': no such pool"}
		}},
		{name: "backup_dir", golden: "status-backups.golden", edit: func(r *statusReport) { r.Backups = sampleBackups() }},
		{name: "backup_dir not mounted", golden: "status-backups-unreadable.golden", edit: func(r *statusReport) {
			r.Backups = &backupsStatus{Dir: "/mnt/backups", Identities: []chainRow{},
				Error: "backup_dir /mnt/backups: stat /mnt/backups/nomad-device-zfs: no such file or directory (is it mounted? the plugin makes nomad-device-zfs/ when it starts)"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := sampleStatus()
			tc.edit(&r)
			var b bytes.Buffer
			must.NoError(t, renderStatus(&b, r, statusNow))
			golden(t, tc.golden, b.Bytes())
		})
	}
}

func TestStatusJSON_RoundTrip(t *testing.T) {
	var b bytes.Buffer
	must.NoError(t, writeJSON(&b, sampleStatus()))
	var back statusReport
	must.NoError(t, json.Unmarshal(b.Bytes(), &back))
	must.Eq(t, sampleStatus(), back)
	// Field names scripts rely on.
	var raw map[string]any
	must.NoError(t, json.Unmarshal(b.Bytes(), &raw))
	slot := raw["slots"].([]any)[2].(map[string]any)
	must.EqOp(t, "in use", slot["state"].(string))
	must.EqOp(t, "build\tnightly", slot["holder"].(map[string]any)["job"].(string))
	must.EqOp(t, float64(2<<20), slot["used_bytes"].(float64))

	// With backup_dir.
	withBackups := sampleStatus()
	withBackups.Backups = sampleBackups()
	b.Reset()
	must.NoError(t, writeJSON(&b, withBackups))
	back = statusReport{}
	must.NoError(t, json.Unmarshal(b.Bytes(), &back))
	must.Eq(t, withBackups, back)
	raw = nil
	must.NoError(t, json.Unmarshal(b.Bytes(), &raw))
	backups := raw["backups"].(map[string]any)
	must.EqOp(t, "/mnt/backups", backups["backup_dir"].(string))
	must.EqOp(t, float64(1), backups["broken"].(float64))
	first := backups["identities"].([]any)[0].(map[string]any)
	must.EqOp(t, float64(3), first["streams"].(float64))
	must.EqOp(t, float64(3<<20), first["newest_bytes"].(float64))
	must.EqOp(t, "db", first["identity"].(map[string]any)["job"].(string))
}

func sampleChecks() []check {
	return []check{
		{Name: "config", Status: checkOK, Message: `/etc/nomad.d/client.hcl: one plugin block; parent tank/nomad; classes scratch: 4 × 64.0 MiB`},
		{Name: "plugin_dir", Status: checkOK, Message: "/opt/nomad/data/plugins/nomad-device-zfs is nomad-device-zfs 0.2.0 (commit 1a2b3c4)"},
		{Name: "zfs", Status: checkOK, Message: "OpenZFS zfs-2.3.2-2~bpo12+2 answers (zfs and zpool on PATH)"},
		{Name: "pool", Status: checkWarn, Message: "pool tank is ONLINE; the slots may write 102.0 MiB (100.0 MiB available, 2.0 MiB used), their quotas add up to 256.0 MiB: over-committed, tenants together could fill the pool before reaching their quotas",
			Fix: "add space, or lower slots or quota, unless the over-commitment is deliberate"},
		{Name: "parent", Status: checkOK, Message: "tank/nomad exists; everything under it is the plugin's"},
		{Name: "slots", Status: checkOK, Message: "4 slots: 3 free, 1 in use, 0 releasing"},
		{Name: "nomad-api", Status: checkOK, Message: "https://127.0.0.1:4646 answers (leader 127.0.0.1:4647)"},
		{Name: "node", Status: checkOK, Message: "node 5e1c0a3d-8f2b-4c41-9a55-2b7f6c0f9e11 (learned from the agent)"},
		{Name: "token", Status: checkFail, Message: `the Nomad token "zfs" cannot read jobs in namespace "other"`,
			Fix: `apply examples/acl/zfs-plugin.policy.hcl (node read, read-job on namespace "*") to the plugin's token; until then every slot a job uses is kept, unhealthy`},
		{Name: "allocations", Status: checkSkip, Message: "needs the node ID"},
	}
}

func TestRenderDoctor_Golden(t *testing.T) {
	var b bytes.Buffer
	must.NoError(t, renderDoctor(&b, sampleChecks()))
	golden(t, "doctor.golden", b.Bytes())
	must.True(t, failed(sampleChecks()))
	must.False(t, failed(sampleChecks()[:8]))

	b.Reset()
	must.NoError(t, writeJSON(&b, sampleChecks()))
	var back []map[string]string
	must.NoError(t, json.Unmarshal(b.Bytes(), &back))
	must.SliceLen(t, 10, back)
	must.EqOp(t, "token", back[8]["check"])
	must.EqOp(t, "fail", back[8]["status"])
	must.StrContains(t, back[8]["fix"], "zfs-plugin.policy.hcl")
	_, hasFix := back[0]["fix"]
	must.False(t, hasFix)
}

func TestPlural(t *testing.T) {
	cases := []struct {
		n          int
		noun, want string
	}{
		{0, "slot", "0 slots"}, {1, "slot", "1 slot"}, {2, "stream", "2 streams"},
		{1, "identity", "1 identity"}, {2, "identity", "2 identities"}, {0, "identity", "0 identities"},
	}
	for _, tc := range cases {
		must.EqOp(t, tc.want, plural(tc.n, tc.noun))
	}
}

func TestBytesIEC(t *testing.T) {
	cases := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {64 << 20, "64.0 MiB"},
		{3<<30 + 512<<20, "3.5 GiB"}, {5 << 40, "5.0 TiB"}, {1 << 62, "4.0 EiB"},
	}
	for _, tc := range cases {
		must.EqOp(t, tc.want, bytesIEC(tc.n))
	}
}

func TestMain_Usage(t *testing.T) {
	cases := []struct {
		args   []string
		code   int
		outHas string
		errHas string
	}{
		{args: []string{"version"}, code: 0, outHas: "nomad-device-zfs "},
		{args: []string{"version", "-help"}, code: 0, outHas: "Usage: nomad-device-zfs version"},
		{args: []string{"version", "extra"}, code: 2, errHas: `unexpected argument "extra"`},
		{args: []string{"status", "-address", "127.0.0.1:4646", "-parent", "tank/nomad"}, code: 1, errHas: "-address=127.0.0.1:4646: want a URL such as http://127.0.0.1:4646"},
		{args: []string{"help"}, code: 0, outHas: "status"},
		{args: []string{"status", "-help"}, code: 0, outHas: "-config=<path>"},
		{args: []string{"doctor", "-help"}, code: 0, outHas: "Exits 1 when any check fails"},
		{args: []string{"nonsense"}, code: 2, errHas: `unknown command "nonsense"`},
		{args: []string{"status", "-bogus"}, code: 2, errHas: "flag provided but not defined: -bogus"},
		{args: []string{"status", "extra"}, code: 2, errHas: `unexpected argument "extra"`},
		{args: []string{"status", "-timeout", "soon"}, code: 2, errHas: "-timeout=soon"},
		{args: []string{"status"}, code: 1, errHas: "give -config=<agent configuration>"},
		{args: []string{"status", "-config", "testdata/nope.hcl"}, code: 1, errHas: "testdata/nope.hcl"},
		{args: []string{"status", "-parent", "-x"}, code: 1, errHas: "-parent=-x"},
	}
	for _, tc := range cases {
		var out, errb bytes.Buffer
		code := Main(tc.args, &out, &errb)
		must.EqOp(t, tc.code, code, must.Sprintf("%v: stdout %q stderr %q", tc.args, out.String(), errb.String()))
		if tc.outHas != "" {
			must.StrContains(t, out.String(), tc.outHas)
		}
		if tc.errHas != "" {
			must.StrContains(t, errb.String(), tc.errHas)
		}
	}
}

// sampleArchives has an identity with a TAB in its job name, an archive
// of an unknown owner, one for each retention rule, and a skipped dataset.
func sampleArchives(now time.Time) archivesReport {
	web := retention.Identity{Namespace: "default", Job: "build\tnightly", Group: "ci", Task: "make", Index: 2, Class: "state"}
	row := func(name string, id retention.Identity, slot int, ago time.Duration, used uint64, why *pruneWhy) archiveRow {
		return archiveRow{Archive: retention.Archive{Name: "tank/nomad/.archive/" + name, Class: id.Class, Slot: slot,
			Identity: id, ReleasedAt: now.Add(-ago), UsedBytes: used}, Where: "local", Prune: why}
	}
	return archivesReport{
		Archive: "tank/nomad/.archive", Exists: true, UsedBytes: 3<<30 + 10<<20, QuotaBytes: 4 << 30, RulesKnown: true,
		Archives: []archiveRow{
			row("state-0.default.build_nightly.ci.make.7f3e2a10.20261124T113000Z", web, 0, 30*time.Minute, 2<<30, nil),
			row("state-1._._._._._.20261124T090000Z", retention.Identity{Class: "state", Index: -1, Unknown: true, Slot: 1}, 1, 3*time.Hour, 5<<20, nil),
			row("state-0.default.build_nightly.ci.make.0b9d6c1e.20261123T120000Z", web, 0, 24*time.Hour, 1<<30,
				&pruneWhy{Rule: "keep", Reason: "keep = 1: the archives of 1 newer allocation(s) of default/\"build\\tnightly\"/ci[2]/make (state) are kept"}),
			row("state-1.default.db.g.t.c4a1f9d2.20261114T120000Z", retention.Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Index: 0, Class: "state"}, 1, 240*time.Hour, 5<<20,
				&pruneWhy{Rule: "max_age", Reason: "max_age = 168h0m0s: released 240h0m0s ago"}),
		},
		Skipped: []retention.Skipped{{Name: "tank/nomad/.archive/notes", Reason: "not the plugin's (no local nomad-device-zfs:managed=slot)"}},
	}
}

func TestRenderArchives_Golden(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	r := sampleArchives(now)
	var out bytes.Buffer
	must.NoError(t, renderArchives(&out, r, now))
	golden(t, "archives.txt", out.Bytes())

	r.DryRun = true
	out.Reset()
	must.NoError(t, renderPrune(&out, r))
	golden(t, "prune-dry-run.txt", out.Bytes())

	out.Reset()
	must.NoError(t, renderArchives(&out, archivesReport{Archive: "tank/nomad/.archive"}, now))
	must.StrContains(t, out.String(), "No archive yet")
}
