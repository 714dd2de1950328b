package backup

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

func TestRestartChain(t *testing.T) {
	full := Manifest{GUID: 1, Size: 1 << 20}
	inc := func(guid uint64, size int64) Manifest { return Manifest{GUID: guid, BaseGUID: guid - 1, Size: size} }
	live := func(m Manifest) Manifest { m.Live = true; return m }
	lives := func(n int) (out []Manifest) {
		for i := range n {
			out = append(out, live(inc(uint64(i+2), 1)))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		chain     []Manifest
		fullEvery int
		restart   bool
	}{
		{"no chain yet", nil, 8, false},
		{"a full stream alone", []Manifest{full}, 8, false},
		{"short increments", []Manifest{full, inc(2, 10), inc(3, 10)}, 8, false},
		{"fullEvery increments", []Manifest{full, inc(2, 10), inc(3, 10)}, 2, true},
		{"the default", []Manifest{full, inc(2, 1), inc(3, 1), inc(4, 1), inc(5, 1), inc(6, 1), inc(7, 1), inc(8, 1), inc(9, 1)}, 0, true},
		{"increments as heavy as the full stream", []Manifest{full, inc(2, 600<<10), inc(3, 424<<10)}, 8, true},
		{"live increments do not count to fullEvery", []Manifest{full, live(inc(2, 1)), live(inc(3, 1)), inc(4, 1)}, 2, false},
		{"LiveFullEvery increments in all", append([]Manifest{full}, lives(LiveFullEvery)...), 8, true},
		{"one fewer than LiveFullEvery", append([]Manifest{full}, lives(LiveFullEvery-1)...), 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.restart, restartChain(tc.chain, tc.fullEvery))
		})
	}
}

func TestPlanPrune(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	// b makes a backup: guid, its base (0: full), its allocation, released
	// hoursAgo; List's order is newest first, so cases list them so.
	b := func(guid, base uint64, alloc string, hoursAgo int) Manifest {
		at := now.Add(-PruneGrace - time.Duration(hoursAgo)*time.Hour)
		return Manifest{GUID: guid, BaseGUID: base, AllocID: alloc, ReleasedAt: at, Created: at,
			path: fmt.Sprintf("/b/id/%d.json", guid), Stream: fmt.Sprintf("%d.zstream", guid)}
	}
	slot := func(m Manifest, i int) Manifest { m.Slot = i; return m }
	from := func(m Manifest, alloc ...string) Manifest { m.From = alloc; return m }
	aside := func(m Manifest) Manifest { m.SetAside = true; return m }
	guids := func(cs []PrunedChain) [][]uint64 {
		var out [][]uint64
		for _, c := range cs {
			var g []uint64
			for _, m := range c.Streams {
				g = append(g, m.GUID)
			}
			out = append(out, append(g, map[string]uint64{"keep": 0, "max_age": 1, "superseded": 2}[c.Rule]))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		ms   []Manifest
		p    retention.Policy
		want [][]uint64 // each chain's GUIDs, oldest first, then 0 for keep, 1 for max_age, 2 for superseded
	}{
		{"one chain is never pruned",
			[]Manifest{b(3, 2, "c", 1), b(2, 1, "b", 2), b(1, 0, "a", 3)}, retention.Policy{Keep: 1}, nil},
		{"an older chain outside keep goes whole",
			[]Manifest{b(5, 4, "e", 1), b(4, 0, "d", 2), b(3, 2, "c", 3), b(2, 1, "b", 4), b(1, 0, "a", 5)}, retention.Policy{Keep: 2},
			[][]uint64{{1, 2, 3, 0}}},
		{"an older chain with a kept allocation stays",
			[]Manifest{b(5, 4, "e", 1), b(4, 0, "d", 2), b(3, 2, "c", 3), b(2, 1, "b", 4), b(1, 0, "a", 5)}, retention.Policy{Keep: 3}, nil},
		{"max_age takes a kept chain when all of it is old",
			[]Manifest{b(4, 0, "d", 1), b(3, 2, "c", 30), b(2, 1, "b", 40), b(1, 0, "a", 50)}, retention.Policy{Keep: 3, MaxAge: 24 * time.Hour},
			[][]uint64{{1, 2, 3, 1}}},
		{"max_age never takes the newest chain",
			[]Manifest{b(2, 1, "b", 40), b(1, 0, "a", 50)}, retention.Policy{Keep: 1, MaxAge: time.Hour}, nil},
		{"a broken newest chain: nothing goes",
			[]Manifest{b(5, 99, "e", 1), b(4, 0, "d", 2), b(1, 0, "a", 5)}, retention.Policy{Keep: 1}, nil},
		{"a broken older stream is never deleted",
			[]Manifest{b(5, 0, "e", 1), b(3, 77, "c", 3), b(1, 0, "a", 5)}, retention.Policy{Keep: 1},
			[][]uint64{{1, 0}}},
		{"a stream of the newest chain missing: nothing goes",
			[]Manifest{b(5, 4, "e", 1), b(4, 0, "d", 2), b(1, 0, "a", 5)}, retention.Policy{Keep: 1}, nil},
		// Live backups: an allocation's older chains go once a newer
		// chain holds its newest stream; one that holds another kept
		// allocation's last stream stays.
		{"an allocation's older live chain is superseded",
			[]Manifest{b(5, 4, "x", 1), b(4, 0, "x", 2), b(3, 2, "x", 3), b(2, 1, "x", 4), b(1, 0, "x", 5)}, retention.Policy{Keep: 3},
			[][]uint64{{1, 2, 3, 2}}},
		{"a chain with a kept allocation's last stream stays",
			[]Manifest{b(5, 4, "x", 1), b(4, 0, "x", 2), b(3, 2, "x", 3), b(2, 1, "w", 4), b(1, 0, "w", 5)}, retention.Policy{Keep: 3}, nil},
		{"an allocation's other slot's chain is not superseded by its first slot's",
			[]Manifest{slot(b(5, 4, "x", 1), 0), slot(b(4, 0, "x", 2), 0), slot(b(3, 2, "x", 3), 1), slot(b(2, 1, "x", 4), 1), slot(b(1, 0, "x", 5), 1)}, retention.Policy{Keep: 3}, nil},
		{"a kept allocation whose newest chain is broken keeps its older chains",
			[]Manifest{b(6, 0, "y", 1), b(5, 77, "x", 2), b(3, 2, "x", 3), b(2, 1, "x", 4), b(1, 0, "x", 5)}, retention.Policy{Keep: 3}, nil},
		// A fork at the newest stream (record.Diverged): nothing goes,
		// whichever fork a chain holds. Without it the same streams
		// lose the older chain to keep = 1.
		{"a late release of an allocation a successor restored from: nothing goes",
			[]Manifest{b(6, 4, "a", 1), from(b(5, 0, "b", 2), "a"), b(4, 0, "a", 8)}, retention.Policy{Keep: 1}, nil},
		{"two allocations restored from the same data: nothing goes",
			[]Manifest{from(b(6, 0, "c", 1), "a"), from(b(5, 0, "b", 2), "a"), b(4, 0, "a", 8)}, retention.Policy{Keep: 1}, nil},
		{"the late release's fork set aside: the fork is resolved, its chain kept for the operator",
			[]Manifest{b(6, 0, "a", 1), aside(from(b(5, 0, "b", 2), "a")), b(3, 2, "a", 8), b(2, 0, "a", 9)}, retention.Policy{Keep: 1},
			[][]uint64{{2, 3, 2}}},
		{"a set-aside chain goes by max_age",
			[]Manifest{b(6, 4, "a", 1), aside(from(b(5, 0, "b", 30), "a")), b(4, 0, "a", 40)}, retention.Policy{Keep: 1, MaxAge: 24 * time.Hour},
			[][]uint64{{5, 1}}},
		{"the newest set aside: the fork is resolved; a set-aside allocation is no kept one",
			[]Manifest{aside(b(7, 4, "a", 1)), from(b(6, 5, "b", 2), "a"), from(b(5, 0, "b", 3), "a"), b(4, 0, "a", 8)}, retention.Policy{Keep: 1},
			nil},
		{"the newest set aside, the other fork's chain older than max_age: it stays, what a restore takes",
			[]Manifest{aside(b(7, 0, "a", 1)), from(b(6, 5, "b", 40), "a"), from(b(5, 0, "b", 41), "a"), b(4, 0, "a", 50)}, retention.Policy{Keep: 1, MaxAge: 24 * time.Hour},
			[][]uint64{{4, 0}}},
		{"the newest allocation's other slot: its chain, older than max_age, stays",
			[]Manifest{slot(b(6, 5, "x", 30), 0), slot(b(5, 0, "x", 31), 0), slot(b(4, 0, "x", 40), 1), b(2, 0, "w", 50)}, retention.Policy{Keep: 1, MaxAge: 24 * time.Hour},
			[][]uint64{{2, 0}}},
		{"the ordinary move: the successor newest, its predecessor's chain goes",
			[]Manifest{from(b(6, 0, "b", 1), "a"), b(5, 4, "a", 2), b(4, 0, "a", 8)}, retention.Policy{Keep: 1},
			[][]uint64{{4, 5, 0}}},
		{"several older chains, newest first",
			[]Manifest{b(6, 0, "f", 1), b(5, 4, "e", 2), b(4, 0, "d", 3), b(3, 2, "c", 4), b(2, 1, "b", 5), b(1, 0, "a", 6)}, retention.Policy{Keep: 1},
			[][]uint64{{4, 5, 0}, {1, 2, 3, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing := func(m Manifest) bool {
				return !(tc.name == "a stream of the newest chain missing: nothing goes" && m.GUID == 4)
			}
			must.Eq(t, tc.want, guids(PlanPrune(tc.ms, tc.p, now, PruneGrace, missing)))
		})
	}
	// A newest chain younger than the grace: readers and senders may
	// still use the older chain.
	young := []Manifest{b(4, 0, "d", 0), b(1, 0, "a", 5)}
	young[0].Created = now.Add(-PruneGrace + time.Minute)
	must.SliceEmpty(t, PlanPrune(young, retention.Policy{Keep: 1}, now, PruneGrace, func(Manifest) bool { return true }))
	must.SliceLen(t, 1, PlanPrune(young, retention.Policy{Keep: 1}, now.Add(time.Minute), PruneGrace, func(Manifest) bool { return true }))
	// Chains that begin more often than the grace (live backups): the
	// chain before the newest stays for the grace, older ones go.
	often := []Manifest{b(6, 0, "x", 0), b(4, 0, "x", 1), b(1, 0, "x", 5)}
	often[0].Created = now.Add(-PruneGrace + time.Minute)
	got := PlanPrune(often, retention.Policy{Keep: 1}, now, PruneGrace, func(Manifest) bool { return true })
	must.Eq(t, [][]uint64{{1, 2}}, guids(got), must.Sprint("the oldest chain, superseded; the one before the newest stays"))
	// Not when the chain before the newest is missing a stream: nothing
	// goes.
	must.SliceEmpty(t, PlanPrune(often, retention.Policy{Keep: 1}, now, PruneGrace, func(m Manifest) bool { return m.GUID != 4 }))
}

func TestLeftovers(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	files := []struct {
		name string
		age  time.Duration
		gone bool
	}{
		{"20261205T100000Z-01.zstream", 2 * PruneGrace, false}, // its manifest names it
		{"20261205T100000Z-01.json", 2 * PruneGrace, false},
		{"20261205T100000Z-02.zstream", 2 * PruneGrace, true}, // no manifest: a crash before it
		{"20261205T115900Z-03.zstream", time.Minute, false},   // no manifest yet: maybe being written
		{".tmp-0123456789abcdef", 2 * PruneGrace, true},
		{".tmp-fedcba9876543210", time.Minute, false},
		{"0123.key", 2 * PruneGrace, false},
	}
	var want []string
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		must.NoError(t, os.WriteFile(p, []byte("x"), 0o600))
		must.NoError(t, os.Chtimes(p, now.Add(-f.age), now.Add(-f.age)))
		if f.gone {
			want = append(want, p)
		}
	}
	ms := []Manifest{{Stream: "20261205T100000Z-01.zstream", path: filepath.Join(dir, "20261205T100000Z-01.json")}}
	got, err := leftovers(dir, ms, now, PruneGrace)
	must.NoError(t, err)
	sort.Strings(want)
	sort.Strings(got)
	must.Eq(t, want, got)
}
