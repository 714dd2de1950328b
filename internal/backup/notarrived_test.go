package backup

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// TestNotArrived: what backup_dir lacks of the data a restore waits for,
// slot by slot, from its manifests (newest first). The wait itself runs on
// real pools (TestBackup_ARestoreWaitsForItsPredecessorsFinalData).
func TestNotArrived(t *testing.T) {
	const (
		p = "pppppppp-0000-0000-0000-000000000001" // the predecessor
		r = "rrrrrrrr-0000-0000-0000-000000000002" // a replacement that never ran
		o = "oooooooo-0000-0000-0000-000000000003" // an older allocation
	)
	now := time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	m := func(alloc string, slot, minutesAgo int, live bool, from ...string) Manifest {
		return Manifest{AllocID: alloc, Slot: slot, Live: live, ReleasedAt: now.Add(-time.Duration(minutesAgo) * time.Minute), From: record.Lineage(from)}
	}
	after := record.Awaited{Alloc: p, Slots: []int{0, 1}, Passed: []string{r}}
	for _, tc := range []struct {
		name  string
		all   []Manifest
		after record.Awaited
		want  string
	}{
		{name: "none of it", all: []Manifest{m(o, 0, 9, false), m(o, 1, 9, false)}, after: after, want: "no backup of slot 0"},
		{name: "one slot of two", all: []Manifest{m(p, 0, 1, false), m(o, 1, 9, false)}, after: after, want: "no backup of slot 1"},
		{name: "a live backup is not its final data", all: []Manifest{m(p, 1, 1, false), m(p, 0, 2, true)}, after: after,
			want: "only a live backup (taken " + now.Add(-2*time.Minute).Format(time.RFC3339) + ") of slot 0"},
		{name: "the final after a live one", all: []Manifest{m(p, 1, 1, false), m(p, 0, 1, false), m(p, 0, 2, true)}, after: after},
		{name: "a replacement that never ran left its data", all: []Manifest{m(r, 0, 1, false, p), m(r, 1, 1, false, p)}, after: after},
		{name: "a replacement whose data is not its", all: []Manifest{m(r, 0, 1, false, o), m(r, 1, 1, false, o)}, after: after, want: "no backup of slot 0"},
		{name: "an allocation not passed, of its data", all: []Manifest{m(o, 0, 1, false, p), m(o, 1, 1, false, p)}, after: after, want: "no backup of slot 0"},
		{name: "slots not known: each it left", all: []Manifest{m(p, 1, 1, false), m(p, 0, 2, true)}, after: record.Awaited{Alloc: p},
			want: "only a live backup (taken " + now.Add(-2*time.Minute).Format(time.RFC3339) + ") of slot 0"},
		{name: "slots not known, nothing of it", all: []Manifest{m(o, 0, 1, false)}, after: record.Awaited{Alloc: p}, want: "no backup"},
		{name: "slots not known, all final", all: []Manifest{m(p, 1, 1, false), m(p, 0, 1, false)}, after: record.Awaited{Alloc: p}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, notArrived(tc.all, tc.after))
		})
	}
}
