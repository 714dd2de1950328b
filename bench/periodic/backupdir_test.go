package periodic

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// stream is one stream a test writes into backup_dir: snapshot guid,
// incremental from base (0: full), left by allocation alloc, made at
// minute min of the test's clock.
type stream struct {
	guid, base uint64
	alloc      string
	min        int
}

// writeStreams writes each stream (bytes long) and its manifest into
// the identity directory of parent job job under dir, as the keeper does.
func writeStreams(t *testing.T, dir, job string, bytes int, ss []stream) {
	t.Helper()
	id := retention.Identity{Namespace: "default", Job: job, Group: "g", Task: "t", Index: 0, Class: class}
	idDir := backup.IdentityDir(dir, id)
	must.NoError(t, os.MkdirAll(idDir, 0o700))
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, s := range ss {
		stem := fmt.Sprintf("s%016x", s.guid)
		m := backup.Manifest{Kind: backup.Kind, Version: 1, Identity: id, AllocID: s.alloc, Dataset: "p/nomad/.archive/x",
			Snapshot: "nomad-device-zfs-x", GUID: s.guid, BaseGUID: s.base, ReleasedAt: t0.Add(time.Duration(s.min) * time.Minute),
			Created: t0.Add(time.Duration(s.min) * time.Minute), Stream: stem + ".zstream", Size: int64(bytes), SHA256: strings.Repeat("0", 64)}
		b, err := json.Marshal(m)
		must.NoError(t, err)
		must.NoError(t, os.WriteFile(filepath.Join(idDir, stem+".json"), b, 0o600))
		must.NoError(t, os.WriteFile(filepath.Join(idDir, m.Stream), make([]byte, bytes), 0o600))
	}
}

// readDir counts what backup_dir holds, and plan what retention keeps of
// it once the grace has passed, by whole chains.
func TestReadDirAndPlan(t *testing.T) {
	// Three chains of one parent: a1+a2, a3+a4, a5 (newest).
	three := []stream{{guid: 1, alloc: "a1", min: 1}, {guid: 2, base: 1, alloc: "a2", min: 2},
		{guid: 3, alloc: "a3", min: 3}, {guid: 4, base: 3, alloc: "a4", min: 4}, {guid: 5, alloc: "a5", min: 5}}
	cases := []struct {
		name        string
		streams     []stream
		stray       string // a file no manifest names ("" none)
		keep        int
		chains      int // now
		keptStreams int
		keptChains  int
		broken      int
	}{
		{name: "one chain stays whole", keep: 1, chains: 1, keptStreams: 3, keptChains: 1,
			streams: []stream{{guid: 1, alloc: "a1", min: 1}, {guid: 2, base: 1, alloc: "a2", min: 2}, {guid: 3, base: 2, alloc: "a3", min: 3}}},
		{name: "keep 2 keeps the chains of the two newest allocations", keep: 2, streams: three, chains: 3, keptStreams: 3, keptChains: 2},
		{name: "keep 1 keeps the newest chain", keep: 1, streams: three, chains: 3, keptStreams: 1, keptChains: 1},
		{name: "keep 3 still counts allocations, not chains", keep: 3, streams: three, chains: 3, keptStreams: 3, keptChains: 2},
		{name: "keep 4 reaches the oldest chain", keep: 4, streams: three, chains: 3, keptStreams: 5, keptChains: 3},
		{name: "a file no manifest names is stray", keep: 1, streams: three[4:], stray: ".tmp-123", chains: 1, keptStreams: 1, keptChains: 1},
		{name: "an increment whose base is gone is broken, and kept", keep: 1, chains: 1, keptStreams: 2, keptChains: 1, broken: 1,
			streams: []stream{{guid: 2, base: 1, alloc: "a2", min: 2}, {guid: 3, alloc: "a3", min: 3}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			must.NoError(t, backup.EnsureRoot(dir))
			const size = 1000
			writeStreams(t, dir, "nightly-0", size, tc.streams)
			if tc.stray != "" {
				must.NoError(t, os.WriteFile(filepath.Join(dir, backup.Root, tc.stray), []byte("x"), 0o600))
			}
			s, err := readDir(dir)
			must.NoError(t, err)
			must.EqOp(t, len(tc.streams), s.Streams)
			must.EqOp(t, int64(len(tc.streams)*size), s.StreamBytes)
			must.EqOp(t, tc.chains, s.Chains["nightly-0"])
			must.SliceLen(t, tc.broken, s.Broken)
			if tc.stray != "" {
				must.SliceLen(t, 1, s.Stray)
				must.StrContains(t, s.Stray[0], tc.stray)
			} else {
				must.SliceEmpty(t, s.Stray)
			}
			kept, bytes, chains := plan(s, tc.keep, time.Now())
			must.SliceLen(t, tc.keptStreams, kept)
			must.EqOp(t, tc.keptChains, chains["nightly-0"])
			var want int64
			for _, m := range kept {
				want += m.Size + fileSize(m.Path())
			}
			must.EqOp(t, want, bytes)
			must.Greater(t, int64(tc.keptStreams*size), bytes) // manifests add to the streams
		})
	}
}
