package retention

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// DefaultKeep is how many archives an identity keeps when its class does
// not say (and for archives of classes no longer configured).
const DefaultKeep = 3

// Policy is one class's retention.
type Policy struct {
	// Keep is how many of an identity's newest allocations keep their
	// archives (≥ 1): an allocation that held several devices left one
	// archive each.
	Keep int
	// MaxAge prunes archives released longer ago than this; 0 for no limit.
	MaxAge time.Duration
	// Backup: the class's archives are sent to backup_dir. One not sent
	// yet (of a known identity, which the keeper sends) is pruned by no
	// rule: it may be the data a replacement on another node waits for.
	Backup bool
}

// Rules is the whole archive's retention.
type Rules struct {
	// Classes maps a class name to its policy. Archives of classes not in
	// it (no longer configured) follow Default.
	Classes map[string]Policy
	Default Policy
	// Quota is archive_quota in bytes, 0 for none. With a quota, the
	// oldest archives are pruned until what the archive uses plus
	// Headroom fits under it.
	Quota uint64
	// Headroom is the room kept free under Quota for the next archive:
	// the largest quota of a class that archives.
	Headroom uint64
}

// policy returns the policy of class.
func (r Rules) policy(class string) Policy {
	if p, ok := r.Classes[class]; ok {
		return p
	}
	return r.Default
}

// Prune is an archive to destroy, with why.
type Prune struct {
	Archive Archive `json:"archive"`
	// Rule is "keep", "max_age" or "archive_quota".
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
}

// Plan returns the archives the rules prune, oldest first, from the
// archives as Parse returned them and what the container uses (usedBytes).
// Per identity it keeps the newest Keep and prunes those older than
// MaxAge; then, with a Quota, it prunes the oldest of the rest until what
// stays, plus Headroom, fits. An archive whose release time lies in the
// future is never pruned by age. It is a pure function.
func Plan(archives []Archive, usedBytes uint64, r Rules, now time.Time) []Prune {
	sorted := append([]Archive(nil), archives...)
	sortNewestFirst(sorted)
	var out []Prune
	settled := make([]bool, len(sorted)) // pruned already, or kept whatever the quota (unsent)
	// An identity's archives are ranked by allocation, newest first: the
	// archives one allocation left (one per device it held) stand or fall
	// together, so that a restore finds all of them.
	allocs := map[Identity][]string{}
	for i, a := range sorted {
		p := r.policy(a.Class)
		key := a.AllocID
		if key == "" {
			key = a.Name // an unknown owner: each archive its own
		}
		n := slices.Index(allocs[a.Identity], key)
		if n < 0 {
			n = len(allocs[a.Identity])
			allocs[a.Identity] = append(allocs[a.Identity], key)
		}
		keep := p.Keep
		if keep < 1 {
			keep = 1
		}
		age := now.Sub(a.ReleasedAt)
		if unsent(p, a) {
			settled[i] = true
			continue
		}
		switch {
		case n >= keep:
			out = append(out, Prune{Archive: a, Rule: "keep",
				Reason: fmt.Sprintf("keep = %d: the archives of %d newer allocation(s) of %s are kept", keep, n, a.Identity)})
		case p.MaxAge > 0 && age > p.MaxAge:
			out = append(out, Prune{Archive: a, Rule: "max_age",
				Reason: fmt.Sprintf("max_age = %s: released %s ago", p.MaxAge, age.Truncate(time.Second))})
		default:
			continue
		}
		settled[i] = true
	}
	if r.Quota > 0 {
		used := usedBytes
		for _, p := range out {
			used = sub(used, p.Archive.UsedBytes)
		}
		// Oldest first: the end of the newest-first list.
		for i := len(sorted) - 1; i >= 0 && used+r.Headroom > r.Quota; i-- {
			if settled[i] {
				continue
			}
			a := sorted[i]
			out = append(out, Prune{Archive: a, Rule: "archive_quota",
				Reason: fmt.Sprintf("archive_quota = %d bytes: the archive uses %d, and %d stay free for the next archive", r.Quota, used, r.Headroom)})
			used = sub(used, a.UsedBytes)
			settled[i] = true
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Archive.ReleasedAt.Equal(out[j].Archive.ReleasedAt) {
			return out[i].Archive.ReleasedAt.Before(out[j].Archive.ReleasedAt)
		}
		return out[i].Archive.Name < out[j].Archive.Name
	})
	return out
}

// HeldForBackup says whether the rules would prune an archive of archives
// but for its not being in backup_dir yet (Policy.Backup): a prune that
// becomes due when the keeper sends it, with no release to ask for a pass.
// It plans as Plan does with every class's Backup off, and looks for an
// archive the real rules hold back among what that plan prunes. It is a
// pure function, and leaves r as it was.
func HeldForBackup(archives []Archive, usedBytes uint64, r Rules, now time.Time) bool {
	free := r
	free.Default.Backup = false
	free.Classes = make(map[string]Policy, len(r.Classes))
	for class, p := range r.Classes {
		p.Backup = false
		free.Classes[class] = p
	}
	for _, pr := range Plan(archives, usedBytes, free, now) {
		if unsent(r.policy(pr.Archive.Class), pr.Archive) {
			return true
		}
	}
	return false
}

// unsent reports whether a, of a class with policy p, waits for its
// backup: the class is sent to backup_dir, a is not marked sent, and its
// identity is known (the keeper sends only those).
func unsent(p Policy, a Archive) bool {
	return p.Backup && a.Backup == "" && !a.Identity.Unknown && a.Identity.Index >= 0
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
