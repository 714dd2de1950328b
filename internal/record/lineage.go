package record

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// PropDataFrom records on a slot's dataset the allocations its data came
// from, newest first: set when a restore hands an identity's data to a
// new allocation (from a local archive, from backup_dir, or in place), and
// kept with the dataset into the archive and into backup_dir's manifests.
// It is what shows that the identity's data forked, when a predecessor's
// release comes late (a lost node that comes back and releases an
// allocation whose replacement already ran elsewhere): the predecessor's
// archive is then newer by time than data that descends from it. See
// Diverged.
const PropDataFrom = "nomad-device-zfs:data-from"

// MaxLineage bounds a lineage: the newest allocations only. Eight
// generations back is far beyond any late release a lost node makes.
const MaxLineage = 8

// Lineage is the allocations a dataset's data came from, newest first.
type Lineage []string

// Descend returns the lineage of data restored from allocation alloc's,
// whose own lineage is l: alloc first, then l, bounded by MaxLineage.
// An unknown alloc ("") adds nothing.
func (l Lineage) Descend(alloc string) Lineage {
	out := Lineage{}
	if alloc != "" {
		out = append(out, alloc)
	}
	for _, a := range l {
		if len(out) >= MaxLineage {
			break
		}
		if a != alloc {
			out = append(out, a)
		}
	}
	return out
}

// Has reports whether alloc is in l.
func (l Lineage) Has(alloc string) bool {
	for _, a := range l {
		if a == alloc {
			return true
		}
	}
	return false
}

// Encode is l as PropDataFrom holds it: the IDs joined by commas; None
// for an empty lineage (zfs-fuse cannot set a property to "").
func (l Lineage) Encode() string {
	if len(l) == 0 {
		return BackupNone
	}
	return strings.Join(l, ",")
}

// ParseLineage reads PropDataFrom's value: "" or BackupNone for none. A
// value that is not a list of allocation IDs is an error naming it; its
// callers then know no lineage, and order the data by time alone, as
// before lineages were recorded.
func ParseLineage(v string) (Lineage, error) {
	if v == "" || v == BackupNone {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > MaxLineage {
		return nil, fmt.Errorf("%s %q: more than %d allocations", PropDataFrom, v, MaxLineage)
	}
	for _, p := range parts {
		if !isAllocID(p) {
			return nil, fmt.Errorf("%s %q: %q is not an allocation ID", PropDataFrom, v, p)
		}
	}
	return Lineage(parts), nil
}

// RecordedLineage is the lineage d records (PropDataFrom, set locally or
// received); none when it records none, or one that does not parse.
func RecordedLineage(d zfs.Dataset) Lineage {
	v, ok := d.Local(PropDataFrom)
	if !ok {
		return nil
	}
	l, _ := ParseLineage(v)
	return l
}

// isAllocID reports whether s looks like a Nomad allocation ID: a UUID,
// 36 characters of hex digits and dashes.
func isAllocID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, r := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if r != '-' {
				return false
			}
		case !strings.ContainsRune("0123456789abcdef", r):
			return false
		}
	}
	return true
}

// ErrDiverged says that an identity's data forked (see Diverged), or that
// the operator's choice between its forks leaves nothing to restore: a
// restore waits for the operator, whatever the class's restore setting.
var ErrDiverged = errors.New("the identity's data forked")

// ErrNotArrived says that the data a restore must start with, its
// asker's predecessor's on another node, has not reached backup_dir yet:
// its release there sends it. A restore waits for it (bounded under
// restore = "best-effort").
var ErrNotArrived = errors.New("the predecessor's data has not arrived")

// Awaited is the data a restore waits for: its asker's predecessor's, from
// another node (see ErrNotArrived). The zero value waits for nothing.
type Awaited struct {
	// Alloc is the predecessor whose data the asker must start with, and
	// Node where it ran; "" for none to wait for.
	Alloc, Node string
	// Slots are the indexes of the class's devices its task held: the
	// final data of each must have arrived.
	Slots []int
	// Passed are the replacements between it and the asker that never
	// ran their task: one may have taken its data (handed over in place,
	// or restored) and left it at its own release; a final backup of one
	// whose lineage names Alloc serves as well.
	Passed []string
}

// Left is one piece of an allocation's data as a store holds it (an
// archive, a manifest in backup_dir): the allocation, the lineage of its
// data, and the time of the data (its release, or a live backup's
// snapshot; zero when unknown).
type Left struct {
	AllocID string
	From    Lineage
	Taken   time.Time
}

// span is what left holds of one allocation: its lineage (the first one
// recorded), and the times of its oldest and newest data.
type span struct {
	from           Lineage
	oldest, newest time.Time
}

// Diverged reports whether the identity's data forked at newest, the
// allocation whose data is the newest by time among left (all that the
// stores hold of one identity), and returns the other fork's allocation:
//
//   - another allocation's lineage names newest (successor true): a
//     successor restored from newest's data and ran on, yet newest's data
//     is newer still. A lost node that came back released it late, or
//     Nomad kept newest after a replacement (a reconnect, a failed canary);
//   - another allocation shares newest's immediate parent and neither
//     descends from the other: both were restored from the same data and
//     both ran, one while the other's node was lost;
//   - newest's data does not descend from that of the newest other
//     allocation (its lineage does not name it, or it has none: it
//     started empty), and that allocation wrote data after newest's line
//     began (the oldest data the stores hold of newest's ancestors, else
//     of newest): two lines of data at once, or a late release whose
//     successors' lineages no longer reach it (past MaxLineage moves). An
//     allocation older than newest's whole line is no fork, however many
//     generations newest's lineage no longer names (hand-overs on one
//     node that never reached backup_dir).
//
// Which fork holds the data the job wants cannot be told from the data:
// the caller refuses to choose. Where newest descends from the newest
// other allocation's data (the ordinary case, however many moves), there
// is no fork. An unknown newest ("") forks nothing. The other returned is
// the first found in left's order, by rule.
func Diverged(left []Left, newest string) (other string, successor bool, ok bool) {
	if newest == "" {
		return "", false, false
	}
	spans := map[string]*span{}
	var order []string
	for _, l := range left {
		if l.AllocID == "" {
			continue
		}
		s, seen := spans[l.AllocID]
		if !seen {
			s = &span{}
			spans[l.AllocID] = s
			order = append(order, l.AllocID)
		}
		if len(s.from) == 0 {
			s.from = l.From
		}
		if !l.Taken.IsZero() {
			if s.oldest.IsZero() || l.Taken.Before(s.oldest) {
				s.oldest = l.Taken
			}
			if l.Taken.After(s.newest) {
				s.newest = l.Taken
			}
		}
	}
	n, known := spans[newest]
	if !known {
		n = &span{}
	}
	for _, a := range order {
		if a != newest && spans[a].from.Has(newest) {
			return a, true, true
		}
	}
	for _, a := range order {
		s := spans[a]
		if a != newest && len(s.from) > 0 && len(n.from) > 0 && s.from[0] == n.from[0] && !n.from.Has(a) {
			return a, false, true
		}
	}
	// The newest other allocation, by the time of its newest data.
	var p string
	for _, a := range order {
		if a != newest && !spans[a].newest.IsZero() && (p == "" || spans[a].newest.After(spans[p].newest)) {
			p = a
		}
	}
	// Since when newest's line holds data: its ancestors' oldest data
	// the stores still hold, else its own oldest.
	since := n.oldest
	for _, a := range n.from {
		if s, ok := spans[a]; ok && !s.oldest.IsZero() && (since.IsZero() || s.oldest.Before(since)) {
			since = s.oldest
		}
	}
	if p != "" && !n.from.Has(p) && !since.IsZero() && spans[p].newest.After(since) {
		return p, false, true
	}
	return "", false, false
}
