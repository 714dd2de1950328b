package backup

import (
	"fmt"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// summaryIDs are two identities of class "state" and one of "other",
// named so that their Strings sort db, web, cache-of-other.
var (
	sumDB    = retention.Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Class: "state"}
	sumWeb   = retention.Identity{Namespace: "default", Job: "web", Group: "g", Task: "t", Class: "state"}
	sumOther = retention.Identity{Namespace: "default", Job: "zz", Group: "g", Task: "t", Class: "other"}
)

// sumManifest is a backup of id: snapshot guid on base (0: a full
// stream), of size bytes, released at minute mins and written a minute
// later.
func sumManifest(id retention.Identity, guid, base uint64, size int64, mins int) Manifest {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC).Add(time.Duration(mins) * time.Minute)
	return Manifest{Identity: id, GUID: guid, BaseGUID: base, Size: size, ReleasedAt: at, Created: at.Add(time.Minute),
		path: fmt.Sprintf("/b/%s/%d.json", id.Job, guid)}
}

func TestSummarize(t *testing.T) {
	m := sumManifest
	at := func(mins int) time.Time { return time.Date(2026, 12, 5, 12, mins, 0, 0, time.UTC) }
	// want is a summary with its chain given by GUIDs.
	type want struct {
		id          retention.Identity
		newest      time.Time // NewestAt
		live        bool
		created     time.Time // NewestCreated
		newestBytes int64
		chain       []uint64
		chainBytes  int64
		complete    bool
		streams     int
		bytes       int64
	}
	cases := []struct {
		name string
		ms   []Manifest // newest first, as List returns them
		want []want
	}{
		{"nothing", nil, []want{}},
		{"a full stream alone", []Manifest{m(sumDB, 1, 0, 100, 0)},
			[]want{{id: sumDB, newest: at(0), created: at(1), newestBytes: 100, chain: []uint64{1}, chainBytes: 100, complete: true, streams: 1, bytes: 100}}},
		{"a full stream and two increments", []Manifest{m(sumDB, 3, 2, 7, 2), m(sumDB, 2, 1, 5, 1), m(sumDB, 1, 0, 100, 0)},
			[]want{{id: sumDB, newest: at(2), created: at(3), newestBytes: 7, chain: []uint64{1, 2, 3}, chainBytes: 112, complete: true, streams: 3, bytes: 112}}},
		{"a new full stream restarts the chain; the older chain still counts in the bytes",
			[]Manifest{m(sumDB, 4, 0, 90, 3), m(sumDB, 3, 2, 7, 2), m(sumDB, 2, 1, 5, 1), m(sumDB, 1, 0, 100, 0)},
			[]want{{id: sumDB, newest: at(3), created: at(4), newestBytes: 90, chain: []uint64{4}, chainBytes: 90, complete: true, streams: 4, bytes: 202}}},
		{"a broken chain: the newest backup is still told, its chain is not",
			[]Manifest{m(sumDB, 3, 2, 7, 2), m(sumDB, 1, 0, 100, 0)},
			[]want{{id: sumDB, newest: at(2), created: at(3), newestBytes: 7, chain: nil, chainBytes: 0, complete: false, streams: 2, bytes: 107}}},
		{"identities apart, ordered by identity whatever List's order",
			[]Manifest{m(sumOther, 9, 0, 1, 9), m(sumWeb, 6, 5, 3, 6), m(sumDB, 2, 1, 5, 5), m(sumWeb, 5, 0, 50, 4), m(sumDB, 1, 0, 100, 0)},
			[]want{
				{id: sumDB, newest: at(5), created: at(6), newestBytes: 5, chain: []uint64{1, 2}, chainBytes: 105, complete: true, streams: 2, bytes: 105},
				{id: sumWeb, newest: at(6), created: at(7), newestBytes: 3, chain: []uint64{5, 6}, chainBytes: 53, complete: true, streams: 2, bytes: 53},
				{id: sumOther, newest: at(9), created: at(10), newestBytes: 1, chain: []uint64{9}, chainBytes: 1, complete: true, streams: 1, bytes: 1},
			}},
		{"a live backup newest, on the chain of its release",
			[]Manifest{func() Manifest { x := m(sumDB, 2, 1, 5, 30); x.Live = true; return x }(), m(sumDB, 1, 0, 100, 0)},
			[]want{{id: sumDB, newest: at(30), created: at(31), live: true, newestBytes: 5, chain: []uint64{1, 2}, chainBytes: 105, complete: true, streams: 2, bytes: 105}}},
		{"no release recorded: the newest backup's time is its stream's",
			[]Manifest{func() Manifest { x := m(sumDB, 1, 0, 10, 0); x.ReleasedAt = time.Time{}; return x }()},
			[]want{{id: sumDB, newest: at(1), created: at(1), newestBytes: 10, chain: []uint64{1}, chainBytes: 10, complete: true, streams: 1, bytes: 10}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Summarize(tc.ms)
			must.SliceLen(t, len(tc.want), got)
			for i, w := range tc.want {
				g := got[i]
				must.Eq(t, w.id, g.Identity)
				must.Eq(t, w.newest, g.NewestAt())
				must.Eq(t, w.created, g.NewestCreated)
				must.EqOp(t, w.live, g.NewestLive)
				must.EqOp(t, w.newestBytes, g.NewestBytes)
				var chain []uint64
				for _, c := range g.Chain {
					chain = append(chain, c.GUID)
				}
				must.Eq(t, w.chain, chain)
				must.EqOp(t, w.chainBytes, g.ChainBytes)
				must.EqOp(t, w.complete, g.Complete())
				must.EqOp(t, w.complete, g.ChainErr == nil)
				must.EqOp(t, w.streams, g.Streams)
				must.EqOp(t, w.bytes, g.Bytes)
			}
		})
	}
}

// The keeper's summary is built from the listings its passes make: a
// listing of the whole of backup_dir replaces it, one of an identity
// replaces that identity's, a pruned chain leaves the counts; it shows
// the classes configured now, and nothing for another backup_dir.
func TestKeeperSummary_FromListings(t *testing.T) {
	dir := t.TempDir()
	k := NewKeeper(nil, hclog.NewNullLogger())
	cfg := Config{Dir: dir, Classes: map[string]bool{"state": true}}
	k.SetConfig(cfg)
	m := sumManifest

	_, ok := k.Summary()
	must.False(t, ok, must.Sprint("no listing yet"))
	// A listing of one identity alone says nothing of backup_dir's whole.
	k.summaries.note(cfg, &sumDB, []Manifest{m(sumDB, 1, 0, 100, 0)})
	_, ok = k.Summary()
	must.False(t, ok, must.Sprint("no listing of the whole yet"))

	// The whole: a class not backed up here is left out.
	k.summaries.note(cfg, nil, []Manifest{m(sumOther, 9, 0, 1, 9), m(sumWeb, 5, 0, 50, 4), m(sumDB, 1, 0, 100, 0)})
	sum, ok := k.Summary()
	must.True(t, ok)
	must.EqOp(t, dir, sum.Dir)
	must.False(t, sum.ListedAt.IsZero())
	must.Eq(t, []retention.Identity{sumDB, sumWeb}, identities(sum))
	must.EqOp(t, int64(150), sum.Bytes())

	// A pass sends an increment of db and lists db again.
	k.summaries.note(cfg, &sumDB, []Manifest{m(sumDB, 2, 1, 5, 5), m(sumDB, 1, 0, 100, 0)})
	sum, _ = k.Summary()
	must.Eq(t, []retention.Identity{sumDB, sumWeb}, identities(sum))
	must.SliceLen(t, 2, sum.Identities[0].Chain)
	must.EqOp(t, int64(105), sum.Identities[0].ChainBytes)
	must.EqOp(t, int64(155), sum.Bytes())

	// Then a new chain of web, and its older chain pruned.
	k.summaries.note(cfg, &sumWeb, []Manifest{m(sumWeb, 7, 0, 40, 7), m(sumWeb, 5, 0, 50, 4)})
	k.summaries.pruned(sumWeb, PrunedChain{Streams: []Manifest{m(sumWeb, 5, 0, 50, 4)}, Rule: "keep"})
	sum, _ = k.Summary()
	web := sum.Identities[1]
	must.Eq(t, sumWeb, web.Identity)
	must.EqOp(t, 1, web.Streams)
	must.EqOp(t, int64(40), web.Bytes)
	must.EqOp(t, int64(40), web.ChainBytes)
	must.EqOp(t, int64(145), sum.Bytes())

	// The classes configured now decide what is shown.
	k.SetConfig(Config{Dir: dir, Classes: map[string]bool{"other": true}})
	sum, ok = k.Summary()
	must.True(t, ok)
	must.SliceEmpty(t, sum.Identities, must.Sprint("other was not listed as a class of this node"))
	k.SetConfig(cfg)

	// The next listing of the whole replaces everything.
	k.summaries.note(cfg, nil, []Manifest{m(sumWeb, 7, 0, 40, 7)})
	sum, _ = k.Summary()
	must.Eq(t, []retention.Identity{sumWeb}, identities(sum))

	// Another backup_dir, or none: nothing known until it is listed.
	other := t.TempDir()
	k.SetConfig(Config{Dir: other, Classes: cfg.Classes})
	_, ok = k.Summary()
	must.False(t, ok)
	k.SetConfig(Config{})
	_, ok = k.Summary()
	must.False(t, ok)
}

func identities(s Summary) []retention.Identity {
	var out []retention.Identity
	for _, i := range s.Identities {
		out = append(out, i.Identity)
	}
	return out
}
