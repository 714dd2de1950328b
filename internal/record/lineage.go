package record

import (
	"fmt"
	"strings"

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

// Left is one allocation's data as a store holds it (an archive, a
// manifest in backup_dir): the allocation, and the lineage of its data.
type Left struct {
	AllocID string
	From    Lineage
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
//     descends from the other (successor false): both were restored from
//     the same data and both ran, one while the other's node was lost.
//
// Which fork holds the data the job wants cannot be told from the data:
// the caller refuses to choose. Where newest descends from every other
// allocation's data (the ordinary case, however many moves), there is no
// fork: newest is what the allocation Nomad kept last left. An unknown
// newest ("") forks nothing. Left's order decides which other is returned
// when there are several.
func Diverged(left []Left, newest string) (other string, successor bool, ok bool) {
	if newest == "" {
		return "", false, false
	}
	var from Lineage
	for _, l := range left {
		if l.AllocID == newest && len(l.From) > 0 {
			from = l.From
			break
		}
	}
	for _, l := range left {
		if l.AllocID == "" || l.AllocID == newest {
			continue
		}
		if l.From.Has(newest) {
			return l.AllocID, true, true
		}
	}
	for _, l := range left {
		if l.AllocID == "" || l.AllocID == newest || len(l.From) == 0 || len(from) == 0 {
			continue
		}
		if l.From[0] == from[0] && !from.Has(l.AllocID) {
			return l.AllocID, false, true
		}
	}
	return "", false, false
}
