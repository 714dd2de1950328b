package backup

// What backup_dir holds of each identity, in a few figures: the newest
// backup's time and size, and the chain that restores it. Summarize is
// the one computation of them; `backups verify` and `status` (the CLI)
// show them, and the keeper keeps them as its passes list backup_dir, for
// the metrics.

import (
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// IdentitySummary is one identity's backups in backup_dir, from their
// manifests alone (no stream is read).
type IdentitySummary struct {
	Identity retention.Identity
	// NewestReleasedAt is the time of the newest backup's data: when its
	// archive's release began, or, for a live backup (NewestLive), when
	// its snapshot was taken while the task ran; NewestCreated when its
	// stream was written; NewestBytes the size of that stream.
	NewestReleasedAt time.Time
	NewestLive       bool
	NewestCreated    time.Time
	NewestBytes      int64
	// Chain is the streams that restore the newest backup, the full
	// stream first (see Chain), and ChainBytes their size; nil and 0 when
	// the chain is broken, ChainErr then saying why.
	Chain      []Manifest
	ChainBytes int64
	ChainErr   error
	// Streams and Bytes count every stream of the identity, the older
	// chains' too.
	Streams int
	Bytes   int64
	// ForkedWith is, when the identity's data forked at its newest backup
	// (record.Diverged; a restore then refuses), the other fork's
	// allocation; "" otherwise. SetAside counts the streams of allocations
	// the operator set aside: the newest is the newest of the others.
	ForkedWith string
	SetAside   int
}

// Complete reports whether the newest backup's chain is whole: a full
// stream and every increment after it (by their manifests).
func (s IdentitySummary) Complete() bool { return s.ChainErr == nil }

// NewestAt is the time of the newest backup's data (NewestReleasedAt), or
// when its stream was written for a manifest that records none.
func (s IdentitySummary) NewestAt() time.Time {
	if s.NewestReleasedAt.IsZero() {
		return s.NewestCreated
	}
	return s.NewestReleasedAt
}

// Summarize returns a summary per identity of ms (manifests as List
// returns them: newest first), ordered by the identity's String. It is a
// pure function.
func Summarize(ms []Manifest) []IdentitySummary {
	byID := map[retention.Identity][]Manifest{}
	for _, m := range ms {
		byID[m.Identity] = append(byID[m.Identity], m) // newest first, as ms
	}
	out := make([]IdentitySummary, 0, len(byID))
	for id, list := range byID {
		out = append(out, summarizeOne(id, list))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Identity.String() < out[j].Identity.String() })
	return out
}

// summarizeOne is Summarize for list, the manifests of identity id,
// newest first.
func summarizeOne(id retention.Identity, list []Manifest) IdentitySummary {
	s := IdentitySummary{Identity: id, Streams: len(list)}
	mine := notSetAside(list)
	s.SetAside = len(list) - len(mine)
	if len(mine) > 0 {
		s.NewestReleasedAt, s.NewestLive, s.NewestCreated, s.NewestBytes = mine[0].ReleasedAt, mine[0].Live, mine[0].Created, mine[0].Size
		s.Chain, s.ChainErr = chainOf(list, mine[0])
		if err := forkAt(id, mine, mine[0], retention.Archive{}); err != nil {
			var d *DivergedError
			if errors.As(err, &d) {
				s.ForkedWith = d.Other.AllocID
			}
		}
	}
	for _, m := range list {
		s.Bytes += m.Size
	}
	for _, m := range s.Chain {
		s.ChainBytes += m.Size
	}
	return s
}

// Summary is backup_dir as the keeper's passes last listed it: the
// identities of the configured classes.
type Summary struct {
	// Dir is the backup_dir listed.
	Dir string
	// ListedAt is when a pass last listed the whole of Dir (every
	// PruneScanPeriod); the identities a pass sent a backup of are listed
	// again at that pass.
	ListedAt time.Time
	// Identities are ordered by the identity's String.
	Identities []IdentitySummary
}

// Bytes is the size of every stream of Identities.
func (s Summary) Bytes() int64 {
	var n int64
	for _, id := range s.Identities {
		n += id.Bytes
	}
	return n
}

// summaries is the keeper's Summary as its passes build it. A pass lists
// backup_dir to prune it: the whole of it every PruneScanPeriod, in
// between the identities it sent; each listing replaces what it covers,
// so no listing is added for the metrics.
type summaries struct {
	// mu guards the fields below. It is held only to read or replace
	// them, never across a read of backup_dir.
	mu       sync.Mutex
	dir      string
	listedAt time.Time // the last listing of the whole of dir; zero for none
	byID     map[retention.Identity]IdentitySummary
}

// note records what a pass's List of cfg.Dir found: ms, the manifests of
// the whole of it (only nil) or of identity only.
func (s *summaries) note(cfg Config, only *retention.Identity, ms []Manifest) {
	keep := ms[:0:0]
	for _, m := range ms {
		if cfg.Classes[m.Identity.Class] && !m.Identity.Unknown {
			keep = append(keep, m)
		}
	}
	sums := Summarize(keep)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir != cfg.Dir || s.byID == nil {
		s.dir, s.listedAt, s.byID = cfg.Dir, time.Time{}, map[retention.Identity]IdentitySummary{}
	}
	if only == nil {
		clear(s.byID)
		s.listedAt = time.Now()
	} else {
		delete(s.byID, *only)
	}
	for _, sum := range sums {
		s.byID[sum.Identity] = sum
	}
}

// pruned takes the streams of c, a chain of identity id that a pass
// deleted, out of the counts. The newest chain is never pruned: the rest
// of the summary stands.
func (s *summaries) pruned(id retention.Identity, c PrunedChain) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum, ok := s.byID[id]
	if !ok {
		return
	}
	for _, m := range c.Streams {
		sum.Streams--
		sum.Bytes -= m.Size
	}
	s.byID[id] = sum
}

// Summary returns backup_dir as the keeper's passes last listed it, the
// identities of the classes configured now; ok is false until a pass has
// listed the whole of the configured backup_dir (or with none
// configured). It reads no file: metrics call it at each scrape.
func (k *Keeper) Summary() (sum Summary, ok bool) {
	cfg, _ := k.config()
	s := &k.summaries
	s.mu.Lock()
	defer s.mu.Unlock()
	if cfg.Dir == "" || s.dir != cfg.Dir || s.listedAt.IsZero() {
		return Summary{}, false
	}
	sum = Summary{Dir: s.dir, ListedAt: s.listedAt}
	for id, one := range s.byID {
		if cfg.Classes[id.Class] {
			sum.Identities = append(sum.Identities, one)
		}
	}
	sort.Slice(sum.Identities, func(i, j int) bool {
		return sum.Identities[i].Identity.String() < sum.Identities[j].Identity.String()
	})
	return sum, true
}
