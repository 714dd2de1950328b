package periodic

// backup_dir against its retention. The plugin deletes an older chain of
// streams only once the newest chain is backup.PruneGrace old (70 min:
// longer than any send or receive), longer than the bench runs; so at the
// end backup_dir holds every chain the run made. The bench judges it
// three ways (bench/README.md says why):
//
//  1. every file in it is a manifest, the stream a manifest names, or a
//     key copy one names: nothing grows outside what retention manages;
//  2. from the manifests, what retention keeps once the grace has passed
//     (backup.PlanPrune at now + PruneGrace): at most keep chains per
//     parent job, and no broken chain;
//  3. once the plugin has stopped, the keeper's own retention pass over
//     the same backup_dir with the grace over (backup.Config.PruneGrace,
//     the tests' field) leaves exactly what the plan kept, and each
//     parent's newest chain still verifies.

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// BackupFigures is backup_dir at the end of the run, and after retention
// with its grace over.
type BackupFigures struct {
	DirState
	// Kept is what retention keeps once the grace has passed
	// (backup.PlanPrune at now + backup.PruneGrace).
	KeptStreams int            `json:"kept_streams"`
	KeptBytes   int64          `json:"kept_bytes"` // its streams and manifests
	KeptChains  map[string]int `json:"kept_chains_per_parent"`
	// After is backup_dir after the keeper's retention pass with the
	// grace over; Verified counts the parents whose newest chain
	// verifies (size and SHA-256 of each stream) after it.
	After    *DirState `json:"after_prune,omitempty"`
	Verified int       `json:"newest_chains_verified"`
	// Sends are the keeper's sends during the churn, one per stream:
	// from its manifest's creation (just before the send) to its stream
	// file's last write (the send written, before its fsync).
	SendP50    time.Duration `json:"send_p50_ns"`
	SendMiBps  float64       `json:"send_mib_per_s"` // all streams' bytes over all sends' time
	SendStream int64         `json:"send_stream_p50_bytes"`
}

// DirState is what backup_dir holds.
type DirState struct {
	Bytes int64 `json:"bytes"` // every regular file under <backup_dir>/nomad-device-zfs
	Files int   `json:"files"`
	// Streams (Full and Incremental) are those the manifests name;
	// StreamBytes their sizes.
	Streams     int   `json:"streams"`
	Full        int   `json:"full"`
	Incremental int   `json:"incremental"`
	StreamBytes int64 `json:"stream_bytes"`
	// Chains counts each parent job's chains (a full stream and the
	// increments on it); Broken lists streams whose chain misses a base.
	Chains map[string]int `json:"chains_per_parent"`
	Broken []string       `json:"broken,omitempty"`
	// Stray lists the files that are no manifest, no stream a manifest
	// names and no key copy one names; Problems the manifests that do
	// not parse.
	Stray    []string         `json:"stray,omitempty"`
	Problems []backup.Problem `json:"problems,omitempty"`

	manifests []backup.Manifest
}

// readDir reads backup_dir: its manifests (backup.List) and every file
// under its nomad-device-zfs directory.
func readDir(dir string) (DirState, error) {
	ms, problems, err := backup.List(dir, nil)
	if err != nil {
		return DirState{}, err
	}
	s := DirState{Problems: problems, Chains: map[string]int{}, manifests: ms}
	named := map[string]bool{}
	for _, p := range problems {
		named[p.Path] = true // counted in Problems
	}
	for _, m := range ms {
		named[m.Path()], named[m.StreamPath()] = true, true
		if m.KeyID != "" {
			named[record.KeyPath(filepath.Dir(m.Path()), m.KeyID)] = true
		}
		s.Streams++
		s.StreamBytes += m.Size
		if m.BaseGUID == 0 {
			s.Full++
		} else {
			s.Incremental++
		}
	}
	err = filepath.WalkDir(filepath.Join(dir, backup.Root), func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		s.Bytes += fi.Size()
		s.Files++
		if !named[path] {
			s.Stray = append(s.Stray, fmt.Sprintf("%s (%d bytes)", path, fi.Size()))
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	roots := rootsOf(ms)
	for _, m := range ms {
		switch root := roots[m.GUID]; {
		case root == 0:
			s.Broken = append(s.Broken, m.Path())
		case root == m.GUID:
			s.Chains[m.Identity.Job]++
		}
	}
	sort.Strings(s.Broken)
	return s, nil
}

// rootsOf maps each stream's snapshot GUID to the GUID of the full stream
// its chain starts from, following bases among ms; 0 for a chain that
// misses a base (or loops).
func rootsOf(ms []backup.Manifest) map[uint64]uint64 {
	byGUID := map[uint64]backup.Manifest{}
	for _, m := range ms {
		byGUID[m.GUID] = m
	}
	roots := map[uint64]uint64{}
	for _, m := range ms {
		cur, root := m, uint64(0)
		for range len(ms) {
			if cur.BaseGUID == 0 {
				root = cur.GUID
				break
			}
			base, ok := byGUID[cur.BaseGUID]
			if !ok {
				break
			}
			cur = base
		}
		roots[m.GUID] = root
	}
	return roots
}

// plan is what retention keeps of s, per identity, once the grace has
// passed: the manifests it keeps, their bytes (streams and manifest
// files) and their chains per parent job.
func plan(s DirState, keep int, now time.Time) (kept []backup.Manifest, bytes int64, chains map[string]int) {
	byID := map[retention.Identity][]backup.Manifest{}
	var ids []retention.Identity
	for _, m := range s.manifests { // newest first, as List
		if _, ok := byID[m.Identity]; !ok {
			ids = append(ids, m.Identity)
		}
		byID[m.Identity] = append(byID[m.Identity], m)
	}
	chains = map[string]int{}
	for _, id := range ids {
		gone := map[uint64]bool{}
		for _, c := range backup.PlanPrune(byID[id], retention.Policy{Keep: keep}, now.Add(backup.PruneGrace), backup.PruneGrace, backup.StreamPresent) {
			for _, m := range c.Streams {
				gone[m.GUID] = true
			}
		}
		var left []backup.Manifest
		for _, m := range byID[id] {
			if !gone[m.GUID] {
				left = append(left, m)
			}
		}
		roots := rootsOf(left)
		for _, m := range left {
			bytes += m.Size + fileSize(m.Path())
			if roots[m.GUID] == m.GUID {
				chains[id.Job]++
			}
		}
		kept = append(kept, left...)
	}
	return kept, bytes, chains
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// measureBackupDir reads backup_dir as the plugin left it and judges it
// (1 and 2 of the file comment).
func (r *periodicRun) measureBackupDir() error {
	s, err := readDir(r.backups)
	if err != nil {
		return fmt.Errorf("reading backup_dir: %w", err)
	}
	f := &r.res.Backup
	f.DirState = s
	r.judgeDir("at the end", s)
	var kept []backup.Manifest
	kept, f.KeptBytes, f.KeptChains = plan(s, r.o.Keep, time.Now())
	f.KeptStreams = len(kept)
	for p, n := range f.KeptChains {
		if n > r.o.Keep {
			r.violate("backup_dir: retention keeps %d chains of parent job %s once the grace has passed, more than keep = %d", n, p, r.o.Keep)
		}
	}
	f.SendP50, f.SendMiBps, f.SendStream = sends(s.manifests)
	r.logf("backup_dir: %.1f MiB in %d files, %d streams (%d full), chains per parent %v; once the grace has passed retention keeps %.1f MiB, %d streams, chains per parent %v",
		mib(s.Bytes), s.Files, s.Streams, s.Full, s.Chains, mib(f.KeptBytes), f.KeptStreams, f.KeptChains)
	return nil
}

// judgeDir records a violation for each stray file, manifest that does
// not parse and broken chain of s.
func (r *periodicRun) judgeDir(when string, s DirState) {
	for _, p := range s.Stray {
		r.violate("backup_dir %s: %s is no manifest, stream or key copy the plugin keeps", when, p)
	}
	for _, p := range s.Problems {
		r.violate("backup_dir %s: %s: %s", when, p.Path, p.Reason)
	}
	for _, p := range s.Broken {
		r.violate("backup_dir %s: the chain of %s misses a base", when, p)
	}
}

// sends returns the keeper's sends' p50, their throughput, and the p50
// stream size.
func sends(ms []backup.Manifest) (p50 time.Duration, mibps float64, size int64) {
	var took []time.Duration
	var sizes []time.Duration // bytes, to reuse the percentile
	var bytes int64
	var total time.Duration
	for _, m := range ms {
		fi, err := os.Stat(m.StreamPath())
		if err != nil || !fi.ModTime().After(m.Created) {
			continue
		}
		d := fi.ModTime().Sub(m.Created)
		took, sizes = append(took, d), append(sizes, time.Duration(m.Size))
		bytes, total = bytes+m.Size, total+d
	}
	if len(took) == 0 {
		return 0, 0, 0
	}
	return bench.Percentile(took, 50), mib(bytes) / total.Seconds(), int64(bench.Percentile(sizes, 50))
}

// pruneGraceOver runs the keeper's retention over backup_dir with the
// grace over, once the plugin has stopped, and judges what is left (3 of
// the file comment).
func (r *periodicRun) pruneGraceOver(ctx context.Context) error {
	f := &r.res.Backup
	kept := map[string]bool{}
	before, _, _ := plan(f.DirState, r.o.Keep, time.Now())
	for _, m := range before {
		kept[m.Path()] = true
	}
	k := backup.NewKeeper(r.client, hclog.NewNullLogger())
	policy := retention.Policy{Keep: r.o.Keep}
	k.SetConfig(backup.Config{Dir: r.backups, Container: r.container(), Classes: map[string]bool{class: true},
		Rules: retention.Rules{Classes: map[string]retention.Policy{class: policy}, Default: policy}, PruneGrace: time.Nanosecond})
	sent, _, err := k.Pass(ctx)
	if err != nil {
		return fmt.Errorf("the keeper's retention pass over backup_dir: %w", err)
	}
	if len(sent) > 0 {
		r.violate("the keeper's pass after the plugin stopped sent %d archives the plugin had left unsent", len(sent))
	}
	after, err := readDir(r.backups)
	if err != nil {
		return fmt.Errorf("reading backup_dir after its retention pass: %w", err)
	}
	f.After = &after
	r.judgeDir("after its retention pass", after)
	for _, m := range after.manifests {
		if !kept[m.Path()] {
			r.violate("backup_dir after its retention pass: %s is left, and the plan deleted it", m.Path())
		}
		delete(kept, m.Path())
	}
	for p := range kept {
		r.violate("backup_dir after its retention pass: %s is gone, and the plan kept it", p)
	}
	if after.Bytes != f.KeptBytes {
		r.violate("backup_dir after its retention pass holds %d bytes, the plan kept %d", after.Bytes, f.KeptBytes)
	}
	byID := map[retention.Identity][]backup.Manifest{}
	for _, m := range after.manifests {
		byID[m.Identity] = append(byID[m.Identity], m)
	}
	for id, ms := range byID {
		if err := verifyNewest(ms); err != nil {
			r.violate("backup_dir after its retention pass: the newest chain of %s: %v", id, err)
			continue
		}
		f.Verified++
	}
	if f.Verified != r.o.Parents {
		r.violate("backup_dir after its retention pass: %d of %d parent jobs have a newest chain that verifies", f.Verified, r.o.Parents)
	}
	r.logf("backup_dir after its retention pass with the grace over: %.1f MiB, %d streams, chains per parent %v; %d newest chains verify",
		mib(after.Bytes), after.Streams, after.Chains, f.Verified)
	return nil
}

// verifyNewest checks the size and SHA-256 of every stream of the chain
// that rebuilds the newest snapshot among ms (one identity's).
func verifyNewest(ms []backup.Manifest) error {
	chain, err := backup.Chain(ms)
	if err != nil {
		return err
	}
	for _, m := range chain {
		if err := backup.Verify(m); err != nil {
			return err
		}
	}
	return nil
}
