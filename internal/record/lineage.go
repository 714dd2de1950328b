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
// It is what tells a successor's data from its predecessor's when the
// predecessor's release comes late (a lost node that comes back and
// releases an allocation whose replacement already ran elsewhere): the
// predecessor's archive is then newer by time, but it is not the identity's
// newest data. See Superseded.
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

// Superseded returns the allocations among what is left whose data a
// later allocation's descends from: some other allocation's lineage names
// them. Their data is never the identity's newest, however late it was
// released: a successor restored from it and ran on. An allocation named
// only in its own lineage is not superseded.
func Superseded(left []Left) map[string]bool {
	out := map[string]bool{}
	for _, l := range left {
		for _, a := range l.From {
			if a != l.AllocID {
				out[a] = true
			}
		}
	}
	return out
}
