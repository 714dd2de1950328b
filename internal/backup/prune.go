package backup

// backup_dir retention: an identity's streams are kept and deleted by
// whole chains (a full stream and the incrementals after it), with the
// same rules as its archives (keep, max_age), and only once a newer
// complete chain exists. A chain restarts from a full stream after
// FullEvery increments, or once its increments weigh as much as its full
// stream, so that older chains can go.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/durable"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// DefaultFullEvery is how many incremental streams follow a full one
// before the next backup of an identity starts a new chain.
const DefaultFullEvery = 8

// PruneGrace is how long a new chain must have existed before the chains
// it replaces may be deleted: longer than any send or receive of a stream
// (SendTimeout), so that a restore on another node that listed the older
// chain before the new one was written has finished reading it, and a
// sender that listed an older base has written its increment (and found
// its base still there: see Keeper.send).
const PruneGrace = SendTimeout + 10*time.Minute

// restartChain reports whether the next backup of an identity whose
// newest chain is chain (full stream first) is sent whole: the chain holds
// fullEvery increments of releases already, or LiveFullEvery increments in
// all (live backups come every backup_interval), or its increments weigh
// as much as its full stream (they no longer save anything).
func restartChain(chain []Manifest, fullEvery int) bool {
	if len(chain) == 0 {
		return false
	}
	if fullEvery <= 0 {
		fullEvery = DefaultFullEvery
	}
	var inc int64
	released := 0
	for _, m := range chain[1:] {
		inc += m.Size
		if !m.Live {
			released++
		}
	}
	return released >= fullEvery || len(chain)-1 >= LiveFullEvery || inc >= chain[0].Size
}

// PrunedChain is a chain of one identity's streams that retention deletes,
// full stream first, with the rule that deletes it.
type PrunedChain struct {
	Streams []Manifest
	Rule    string
}

// PlanPrune decides which chains of one identity's streams (ms, as List
// returns them for that identity: newest first) retention deletes under
// policy p at now. It is a pure function. Nothing is deleted unless the
// newest stream's chain is complete (its manifests link up, and present
// says each of its streams is there whole) and began grace (PruneGrace in
// the plugin) before now, or one older is complete and did (the anchor:
// only chains older than it go); the newest chain is never deleted. An older chain is
// deleted whole when none of its streams is of the newest p.Keep
// allocations (rule "keep"); when it holds none of their newest streams,
// only older ones (live backups: rule "superseded"); or when every stream
// of it was released longer ago than p.MaxAge (rule "max_age"). A stream whose chain is broken (its base missing) is never
// deleted: it is reported by `backups verify`, and left to the operator.
// Nothing is deleted while the identity's data forked at its newest
// stream (record.Diverged): each fork may be the one the job wants. The
// allocations the operator set aside count as no kept allocation, and the
// fork they were part of as resolved; a chain that holds a stream of one
// goes by max_age alone, and the chain of the newest stream not set aside
// (what a restore takes) is never deleted.
func PlanPrune(ms []Manifest, p retention.Policy, now time.Time, grace time.Duration, present func(Manifest) bool) []PrunedChain {
	if len(ms) == 0 {
		return nil
	}
	newest, err := Chain(ms)
	if err != nil {
		return nil // no complete newest chain: nothing goes
	}
	mine := notSetAside(ms)
	if forked(mine) {
		return nil // which fork is wanted is not known: both stay
	}
	// The chains of the newest allocation's backups, each slot's newest,
	// and of the newest not set aside (what a restore takes), are never
	// deleted either.
	protected := map[uint64]bool{}
	for _, alloc := range []string{ms[0].AllocID, firstAlloc(mine)} {
		if alloc == "" {
			continue
		}
		for _, m := range newestPerSlot(ms, alloc) {
			if c, err := chainOf(ms, m); err == nil {
				protected[c[0].GUID] = true // a broken one is never deleted anyway
			}
		}
	}
	for _, m := range newest {
		if !present(m) {
			return nil // a stream of it is missing or cut: nothing goes
		}
	}
	index := byGUID(ms)
	// rootOf is the GUID of the full stream a stream's chain starts from;
	// 0 for a broken chain.
	rootOf := func(m Manifest) uint64 {
		chain, err := chainIn(index, m)
		if err != nil {
			return 0
		}
		return chain[0].GUID
	}
	// The newest p.Keep allocations, newest first, as retention counts
	// archives.
	kept := map[string]bool{}
	for _, m := range ms {
		if len(kept) >= p.Keep {
			break
		}
		if !m.SetAside {
			kept[m.AllocID] = true // a set-aside allocation is no kept one
		}
	}
	// The chains that hold a kept allocation's newest stream of each of
	// its slots: its data as it last was. A chain that holds only older streams of kept
	// allocations (live backups since sent again in a newer chain) is
	// superseded. An allocation whose newest stream's chain is broken
	// needs all of its chains.
	// Per allocation and slot: an allocation that held several devices
	// left a dataset (and a chain) per slot.
	type allocSlot struct {
		alloc string
		slot  int
	}
	holds, unsure, newestSeen := map[uint64]bool{}, map[string]bool{}, map[allocSlot]bool{}
	for _, m := range ms {
		if !kept[m.AllocID] || newestSeen[allocSlot{m.AllocID, m.Slot}] {
			continue
		}
		newestSeen[allocSlot{m.AllocID, m.Slot}] = true
		if chain, err := chainIn(index, m); err == nil && allPresent(chain, present) {
			holds[chain[0].GUID] = true
		} else {
			unsure[m.AllocID] = true
		}
	}
	chains := map[uint64][]Manifest{}
	var roots []uint64
	for _, m := range ms {
		r := rootOf(m)
		if r == 0 || r == newest[0].GUID || protected[r] {
			continue
		}
		if _, seen := chains[r]; !seen {
			roots = append(roots, r) // newest first, as ms
		}
		chains[r] = append(chains[r], m)
	}
	// Readers and senders that listed backup_dir before a chain began may
	// still use the chain before it, for grace: only chains older than
	// the newest complete chain that began longer ago than grace (the
	// anchor) may go. With live backups a new chain may begin more often
	// than grace; the older ones still go.
	if now.Sub(newest[0].Created) < grace {
		anchor := -1
		for i, r := range roots {
			if allPresent(chains[r], present) && now.Sub(index[r].Created) >= grace {
				anchor = i
				break
			}
		}
		if anchor < 0 {
			return nil
		}
		roots = roots[anchor+1:]
	}
	var out []PrunedChain
	for _, r := range roots {
		c := chains[r]
		sort.SliceStable(c, func(i, j int) bool { return c[i].Created.Before(c[j].Created) })
		inKeep, needed, allOld := false, holds[r], p.MaxAge > 0
		for _, m := range c {
			// A set-aside stream is kept for the operator (max_age
			// aside): keep's count and the newer chains do not
			// replace what they chose not to restore.
			inKeep = inKeep || kept[m.AllocID] || m.SetAside
			needed = needed || unsure[m.AllocID] || m.SetAside
			allOld = allOld && now.Sub(m.ReleasedAt) > p.MaxAge
		}
		switch {
		case !inKeep:
			out = append(out, PrunedChain{Streams: c, Rule: "keep"})
		case !needed:
			out = append(out, PrunedChain{Streams: c, Rule: "superseded"})
		case allOld:
			out = append(out, PrunedChain{Streams: c, Rule: "max_age"})
		}
	}
	return out
}

// deleteChain removes the streams of c from backup_dir, newest first, so
// that whatever a crash leaves is still a whole chain that a later pass
// deletes; each manifest before its stream, so that a reader that lists
// after it never finds a manifest whose stream is gone; then the key copies
// no remaining manifest of the identity names. left are the identity's
// manifests that stay.
func deleteChain(c PrunedChain, left []Manifest) error {
	var errs []error
	dirs := map[string]bool{}
	for i := len(c.Streams) - 1; i >= 0; i-- {
		m := c.Streams[i]
		dirs[filepath.Dir(m.Path())] = true
		if err := os.Remove(m.Path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue // the stream stays with its manifest
		}
		if err := os.Remove(m.StreamPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	keys := map[string]bool{}
	for _, m := range c.Streams {
		if m.KeyID != "" {
			keys[m.KeyID] = true
		}
	}
	for _, m := range left {
		delete(keys, m.KeyID)
	}
	for dir := range dirs {
		for id := range keys {
			if err := record.RemoveKey(dir, id); err != nil {
				errs = append(errs, fmt.Errorf("key copy %s: %w", id, err))
			}
		}
		if err := durable.SyncDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// StreamPresent reports whether m's stream is in backup_dir at the size its
// manifest records: a cheap check (no checksum) that a chain about to
// stand alone has not lost a stream. `backups verify` checks the bytes.
func StreamPresent(m Manifest) bool {
	fi, err := os.Stat(m.StreamPath())
	return err == nil && fi.Mode().IsRegular() && fi.Size() == m.Size
}

// leftovers returns the files of identity directory dir that no backup is
// made of and that were last changed longer than grace ago (PruneGrace:
// longer than any send, so never a stream still being written): temporary
// files (".tmp-*", a write cut short by a crash) and streams that none of
// ms, the directory's manifests, names (a crash between a stream's rename
// and its manifest's). Manifests and key files are never among them.
func leftovers(dir string, ms []Manifest, now time.Time, grace time.Duration) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, m := range ms {
		if filepath.Dir(m.Path()) == dir {
			named[m.Stream] = true
		}
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || !(strings.HasPrefix(n, ".tmp-") || strings.HasSuffix(n, ".zstream") && !named[n]) {
			continue
		}
		fi, err := e.Info()
		if err != nil || now.Sub(fi.ModTime()) <= grace {
			continue
		}
		out = append(out, filepath.Join(dir, n))
	}
	return out, nil
}

// firstAlloc is the allocation of ms's first manifest; "" for none.
func firstAlloc(ms []Manifest) string {
	if len(ms) == 0 {
		return ""
	}
	return ms[0].AllocID
}

// allPresent reports whether present says every stream of ms is there.
func allPresent(ms []Manifest, present func(Manifest) bool) bool {
	for _, m := range ms {
		if !present(m) {
			return false
		}
	}
	return true
}
