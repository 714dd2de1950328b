package retention

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// savedGet parses testdata's saved zfs-fuse output of the archive
// container "capt/nomad/.archive" (three archives, and children retention
// leaves alone). It was captured before Props held the key ID (no archive
// there is encrypted; zfs-fuse has no encryption) and the data's lineage
// (none there was restored): the props asked for then.
func savedGet(t *testing.T) []zfs.Dataset {
	t.Helper()
	out, err := os.ReadFile("testdata/get-archive-zfs-fuse-0.7.txt")
	must.NoError(t, err)
	captured := slices.DeleteFunc(slices.Clone(Props), func(p string) bool { return p == record.PropKeyID || p == record.PropDataFrom })
	ds, err := zfs.ParseGet(out, append(captured, "name"))
	must.NoError(t, err)
	return ds
}

func TestParse_SavedZFSFuseOutput(t *testing.T) {
	ds := savedGet(t)

	c, arch, skipped := Parse("capt/nomad/.archive", ds)
	must.True(t, c.Exists)
	must.Eq(t, uint64(802816), c.UsedBytes)
	must.Eq(t, uint64(100<<20), c.QuotaBytes)
	must.Eq(t, uint64(0), c.QuotaMark)

	names := make([]string, len(arch))
	for i, a := range arch {
		names[i] = strings.TrimPrefix(a.Name, "capt/nomad/.archive/")
	}
	// Newest first.
	must.Eq(t, []string{
		"state-1._._._._._.20261121T080000Z",
		"state-0.default.web.g.server.1a2b3c4d.20261120T101500Z",
		"scratch-1.default.old.g.t.0f0f0f0f.20261101T000000Z",
	}, names)

	must.Eq(t, Identity{Class: "state", Index: -1, Unknown: true, Slot: 1}, arch[0].Identity)
	must.Eq(t, Identity{Namespace: "default", Job: "web", Group: "g", Task: "server", Index: 2, Class: "state"}, arch[1].Identity)
	must.Eq(t, "1a2b3c4d-0000-4000-8000-000000000001", arch[1].AllocID)
	must.Eq(t, time.Date(2026, 11, 20, 10, 15, 0, 0, time.UTC), arch[1].ReleasedAt)
	must.Eq(t, 0, arch[1].Slot)
	must.Eq(t, "1234567890123", arch[1].Backup)
	must.Eq(t, "", arch[0].Backup)
	must.Positive(t, arch[1].UsedBytes)
	// The legacy owner properties still identify an earlier version's archive.
	must.Eq(t, Identity{Namespace: "default", Job: "old", Group: "g", Task: "t", Index: 0, Class: "scratch"}, arch[2].Identity)

	why := map[string]string{}
	for _, s := range skipped {
		why[strings.TrimPrefix(s.Name, "capt/nomad/.archive/")] = s.Reason
	}
	must.MapLen(t, 3, why)
	must.StrContains(t, why["operator-notes"], "not the plugin's")
	must.StrContains(t, why["renamed-by-hand"], "name not made by the plugin")
	must.StrContains(t, why["scratch-0.default.web.g.server.1a2b3c4d.20261122T090000Z"], `state "destroying"`)
}

func TestParse_UnreadableAndDeeper(t *testing.T) {
	bad := zfs.Dataset{Name: "p/.archive/x-0.a.b.c.d.e.20261120T101500Z", Err: zfs.ErrMalformed}
	deeper := zfs.Dataset{Name: "p/.archive/x-0.a.b.c.d.e.20261120T101500Z/child"}
	other := zfs.Dataset{Name: "p/other"}
	_, arch, skipped := Parse("p/.archive", []zfs.Dataset{bad, deeper, other})
	must.SliceEmpty(t, arch)
	must.SliceLen(t, 1, skipped)
	must.StrContains(t, skipped[0].Reason, "unreadable")
}

func TestIdentity_String(t *testing.T) {
	cases := []struct {
		id   Identity
		want string
	}{
		{Identity{Namespace: "default", Job: "web", Group: "g", Task: "t", Index: 3, Class: "state"}, "default/web/g[3]/t (state)"},
		{Identity{Namespace: "default", Job: "a\tb", Group: "g/h", Task: "", Index: -1, Class: "state"}, `default/"a\tb"/"g/h"[?]/"" (state)`},
		{Identity{Class: "state", Unknown: true, Slot: 4}, "owner unknown, slot state-4"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			must.Eq(t, tc.want, tc.id.String())
		})
	}
}

// TestIdentityOf_RunsOfOneParent: the runs of a periodic or dispatched job
// (each a new job) are their parent's identity, so keep counts them
// together; an archive an earlier build recorded without the parent stays
// the run's own identity.
func TestIdentityOf_RunsOfOneParent(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	run := func(n int, parent string) record.Owner {
		job := fmt.Sprintf("nightly/periodic-%d", 1733400000+n)
		return record.Owner{AllocID: fmt.Sprintf("a%d", n), Namespace: "default", Job: job, Group: "g", Task: "t",
			AllocName: job + ".g[0]", Parent: parent}
	}
	parentID := Identity{Namespace: "default", Job: "nightly", Group: "g", Task: "t", Index: 0, Class: "state"}
	must.Eq(t, parentID, IdentityOf("state", run(1, "nightly")))
	must.Eq(t, "nightly/periodic-1733400001", IdentityOf("state", run(1, "")).Job)

	var archives []Archive
	for n, parent := range []string{"nightly", "nightly", "nightly", ""} {
		o := run(n, parent)
		at := now.Add(-time.Duration(n) * time.Hour)
		archives = append(archives, Archive{Name: record.ArchivedName("p/.archive", "state", 0, o, at), AllocID: o.AllocID,
			Class: "state", Identity: IdentityOf("state", o), ReleasedAt: at, UsedBytes: 1 << 20})
	}
	pruned := Plan(archives, 0, Rules{Classes: map[string]Policy{"state": {Keep: 1}}}, now)
	var names []string
	for _, p := range pruned {
		names = append(names, p.Archive.Name)
	}
	// The newest run is kept; the two older runs of the parent go; the
	// run recorded without its parent is an identity of its own, kept.
	must.Eq(t, []string{archives[2].Name, archives[1].Name}, names)
}
