package record

import (
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestArchiveLeaf(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	o := Owner{AllocID: "12345678-9abc", Namespace: "prod", Job: "a/b c", Group: "g", Task: "t@1"}
	must.Eq(t, "scratch-0.prod.a_b_c.g.t_1.12345678.20260102T030405Z", ArchiveLeaf("scratch", 0, o, at, MaxNameLen))
	must.Eq(t, "scratch-0._._._._._.20260102T030405Z", ArchiveLeaf("scratch", 0, Owner{}, at, MaxNameLen))
	long := Owner{AllocID: "x", Namespace: "n", Job: string(make([]byte, 100)), Group: "g", Task: "t"}
	must.NoError(t, zfs.ValidateDatasetName("tank/"+ArchiveLeaf("s", 1, long, at, MaxNameLen)))
}

// Every archive name fits ZFS's 255 bytes, whatever the names, for the
// longest parent that the configuration accepts; shortened names stay
// unique per allocation and release time, and readable at the front.
func TestArchivedName_FitsZFS(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	maxParent := MaxNameLen - len("/"+ArchiveName+"/") - MinArchiveLeafLen
	longName := strings.Repeat("n", 200)
	class := strings.Repeat("c", 32)
	cases := []struct {
		name   string
		parent string
		owner  Owner
		index  int
	}{
		{"short everything", "tank/nomad", Owner{AllocID: "0b1c2d3e-aaaa", Namespace: "default", Job: "web", Group: "g", Task: "t"}, 0},
		{"long names, short parent", "tank/nomad", Owner{AllocID: "0b1c2d3e-aaaa", Namespace: longName, Job: longName, Group: longName, Task: longName}, 3},
		{"long names, longest parent", "tank/" + strings.Repeat("p", maxParent-5), Owner{AllocID: "0b1c2d3e-aaaa", Namespace: longName, Job: longName, Group: longName, Task: longName}, 9999},
		{"control characters", "tank/nomad", Owner{AllocID: "0b1c2d3e-aaaa", Namespace: "default", Job: "a\tb\nc", Group: "g", Task: "t"}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			archive := tc.parent + "/" + ArchiveName
			name := ArchivedName(archive, class, tc.index, tc.owner, at)
			must.LessEq(t, MaxNameLen, len(name), must.Sprint(name))
			must.NoError(t, zfs.ValidateDatasetName(name))
			must.StrHasPrefix(t, archive+"/"+class+"-", name)
			other := tc.owner
			other.AllocID = "ffffffff-aaaa"
			must.NotEq(t, name, ArchivedName(archive, class, tc.index, other, at))
			must.NotEq(t, name, ArchivedName(archive, class, tc.index, tc.owner, at.Add(time.Second)))
		})
	}
}
