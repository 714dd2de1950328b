package backup

import (
	"errors"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

func TestForkAt(t *testing.T) {
	const (
		a = "aaaaaaaa-0000-0000-0000-000000000001"
		b = "bbbbbbbb-0000-0000-0000-000000000002"
		c = "cccccccc-0000-0000-0000-000000000003"
	)
	now := time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	id := retention.Identity{Class: "scratch", Namespace: "default", Job: "web", Group: "g", Task: "t", Index: 0}
	// m is a manifest of alloc's data taken minutesAgo, restored from from.
	m := func(alloc string, minutesAgo int, from ...string) Manifest {
		return Manifest{AllocID: alloc, Node: "node-" + alloc[:1], ReleasedAt: now.Add(-time.Duration(minutesAgo) * time.Minute),
			From: record.Lineage(from), path: "/b/" + alloc[:1] + ".json"}
	}
	archive := func(alloc string, minutesAgo int, from ...string) retention.Archive {
		return retention.Archive{Name: "tank/archive/" + alloc[:1], AllocID: alloc, ReleasedAt: now.Add(-time.Duration(minutesAgo) * time.Minute), From: record.Lineage(from)}
	}
	type side struct{ alloc, where string }
	for _, tc := range []struct {
		name      string
		ms        []Manifest // newest first
		local     retention.Archive
		forked    bool
		newest    side
		other     side
		successor bool
	}{
		{name: "the ordinary move: B restored A's release and is newest",
			ms: []Manifest{m(b, 5, a), m(a, 30)}},
		{name: "the ordinary move back: the local archive of A, B's release newer",
			ms: []Manifest{m(b, 5, a), m(a, 30)}, local: archive(a, 30)},
		{name: "a late release in backup_dir: A's final stream after B restored A's live backup and ran",
			ms: []Manifest{m(a, 1), m(b, 5, a), m(a, 30)}, forked: true,
			newest: side{a, "/b/a.json"}, other: side{b, "/b/b.json"}, successor: true},
		{name: "a late release in the local archive, backup_dir's newest older",
			ms: []Manifest{m(b, 5, a), m(a, 30)}, local: archive(a, 1), forked: true,
			newest: side{a, "the local archive tank/archive/a"}, other: side{b, "/b/b.json"}, successor: true},
		{name: "siblings: B and C both restored from A's data, both ran",
			ms: []Manifest{m(c, 1, a), m(b, 5, a), m(a, 30)}, forked: true,
			newest: side{c, "/b/c.json"}, other: side{b, "/b/b.json"}},
		{name: "C restored from B, which restored from A: one line",
			ms: []Manifest{m(c, 1, b, a), m(b, 5, a), m(a, 30)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := forkAt(id, tc.ms, tc.ms[0], tc.local)
			if !tc.forked {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, ErrDiverged)
			var d *DivergedError
			must.True(t, errors.As(err, &d))
			must.Eq(t, side{tc.newest.alloc, tc.newest.where}, side{d.Newest.AllocID, d.Newest.Where})
			must.Eq(t, side{tc.other.alloc, tc.other.where}, side{d.Other.AllocID, d.Other.Where})
			must.EqOp(t, tc.successor, d.Successor)
			// The message names both forks and where to read on.
			for _, s := range []string{id.String(), d.Newest.AllocID, d.Newest.Where, d.Other.AllocID, d.Other.Where, "docs/operations.md"} {
				must.StrContains(t, err.Error(), s)
			}
			must.True(t, forked(tc.ms) == (tc.local.Name == ""), must.Sprint("backup_dir's retention sees the fork in its manifests alone"))
		})
	}
}
