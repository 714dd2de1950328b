package record_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

const (
	allocA = "aaaaaaaa-0000-0000-0000-000000000001"
	allocB = "bbbbbbbb-0000-0000-0000-000000000002"
	allocC = "cccccccc-0000-0000-0000-000000000003"
)

func TestLineage_Descend(t *testing.T) {
	long := record.Lineage{}
	for i := 0; i < record.MaxLineage; i++ {
		long = append(long, "00000000-0000-0000-0000-00000000000"+string(rune('0'+i)))
	}
	cases := []struct {
		name  string
		from  record.Lineage
		alloc string
		want  record.Lineage
	}{
		{"first restore", nil, allocA, record.Lineage{allocA}},
		{"second", record.Lineage{allocA}, allocB, record.Lineage{allocB, allocA}},
		{"no repeat", record.Lineage{allocA, allocB}, allocA, record.Lineage{allocA, allocB}},
		{"unknown adds nothing", record.Lineage{allocA}, "", record.Lineage{allocA}},
		{"bounded, oldest dropped", long, allocC, append(record.Lineage{allocC}, long[:record.MaxLineage-1]...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.from.Descend(tc.alloc)
			must.Eq(t, tc.want, got)
			back, err := record.ParseLineage(got.Encode())
			must.NoError(t, err)
			must.Eq(t, got, back)
		})
	}
}

func TestLineage_Parse(t *testing.T) {
	cases := []struct {
		value   string
		want    record.Lineage
		wantErr string
	}{
		{"", nil, ""},
		{record.BackupNone, nil, ""},
		{allocA, record.Lineage{allocA}, ""},
		{allocB + "," + allocA, record.Lineage{allocB, allocA}, ""},
		{allocA + ",", nil, `"" is not an allocation ID`},
		{"x" + allocA[1:], nil, "is not an allocation ID"},
		{strings.ToUpper(allocA), nil, "is not an allocation ID"},
		{strings.Repeat(allocA+",", record.MaxLineage) + allocB, nil, "more than 8 allocations"},
	}
	for _, tc := range cases {
		t.Run(tc.value, func(t *testing.T) {
			got, err := record.ParseLineage(tc.value)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				must.ErrorContains(t, err, record.PropDataFrom)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
}

func TestDiverged(t *testing.T) {
	allocD := "dddddddd-0000-0000-0000-000000000004"
	base := time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)
	// l is data of alloc taken at minute, restored from from.
	l := func(alloc string, minute int, from ...string) record.Left {
		return record.Left{AllocID: alloc, From: record.Lineage(from), Taken: base.Add(time.Duration(minute) * time.Minute)}
	}
	type want struct {
		other     string
		successor bool
		ok        bool
	}
	// nine is a line of nine moves after A: each restored from the one
	// before, the lineage bounded at MaxLineage; ids[0] is A.
	ids := []string{allocA}
	for i := 1; i <= 9; i++ {
		ids = append(ids, fmt.Sprintf("%08x-0000-0000-0000-%012x", i, i))
	}
	var nine []record.Left
	var from record.Lineage
	for i := 1; i <= 9; i++ {
		from = from.Descend(ids[i-1])
		nine = append(nine, l(ids[i], 10*i, from...))
	}
	cases := []struct {
		name   string
		left   []record.Left
		newest string
		want   want
	}{
		{"nothing restored, one allocation", []record.Left{l(allocA, 1), l(allocA, 2)}, allocA, want{}},
		{"B restored from A and is newest: the ordinary move", []record.Left{l(allocA, 1), l(allocB, 5, allocA)}, allocB, want{}},
		{"C from B from A, C newest", []record.Left{l(allocA, 1), l(allocB, 5, allocA), l(allocC, 9, allocB, allocA)}, allocC, want{}},
		{"A newest, B restored from it: a late release", []record.Left{l(allocA, 9), l(allocA, 1), l(allocB, 5, allocA)}, allocA, want{allocB, true, true}},
		{"A newest, C descends from it through B, B's gone", []record.Left{l(allocA, 9), l(allocC, 5, allocB, allocA)}, allocA, want{allocC, true, true}},
		{"B newest, C from B and A: B late", []record.Left{l(allocB, 9, allocA), l(allocC, 5, allocB, allocA)}, allocB, want{allocC, true, true}},
		{"B and C both from A, B newest: siblings", []record.Left{l(allocA, 1), l(allocB, 9, allocA), l(allocC, 5, allocA)}, allocB, want{allocC, false, true}},
		{"D from C from A, B from A older: D descends from C, the newest other", []record.Left{l(allocB, 3, allocA), l(allocC, 5, allocA), l(allocD, 9, allocC, allocA)}, allocD, want{}},
		{"D from B from A, C from A newer than B: D does not descend from C", []record.Left{l(allocB, 3, allocA), l(allocC, 5, allocA), l(allocD, 9, allocB, allocA)}, allocD, want{allocC, false, true}},
		{"own lineage does not count", []record.Left{l(allocA, 1, allocA)}, allocA, want{}},
		{"an unknown allocation is never a fork", []record.Left{{AllocID: ""}, l(allocB, 5, allocA)}, allocB, want{}},
		{"an unknown newest forks nothing", []record.Left{l(allocB, 5, allocA)}, "", want{}},
		{"the same allocation twice (two slots, a local archive and its stream)", []record.Left{l(allocB, 5, allocA), l(allocB, 6, allocA), l(allocA, 1)}, allocB, want{}},
		{"nine moves: the last descends from the one before", nine, ids[9], want{}},
		{"nine moves, then A's late release, only the last move's data left: its lineage no longer names A, whose oldest data is before it",
			append([]record.Left{l(allocA, 200), l(allocA, 1)}, nine[8:]...), allocA, want{ids[9], false, true}},
		{"the same with every move's data left: the moves' lineages name A",
			append([]record.Left{l(allocA, 200), l(allocA, 1)}, nine...), allocA, want{ids[1], true, true}},
		{"nine hand-overs on one node that never reached the stores: an allocation older than the whole line is no fork",
			[]record.Left{l(allocA, 1), l(ids[9], 100, nine[8].From...)}, ids[9], want{}},
		{"the same, an ancestor held: older than it, no fork",
			[]record.Left{l(allocA, 1), l(ids[5], 50, nine[4].From...), l(ids[9], 100, nine[8].From...)}, ids[9], want{}},
		{"restore turned on: the newest restored D (never sent), the newest other's data older than its line",
			[]record.Left{l(allocB, 1), l(allocB, 3), l(allocC, 9, allocD)}, allocC, want{}},
		{"started empty while another wrote: two lines at once", []record.Left{l(allocA, 1), l(allocA, 9), l(allocB, 5)}, allocA, want{allocB, false, true}},
		{"started empty after the other's data (no lineage recorded: data restored before lineages were)", []record.Left{l(allocA, 1), l(allocA, 3), l(allocB, 5), l(allocB, 9)}, allocB, want{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			other, successor, ok := record.Diverged(tc.left, tc.newest)
			must.Eq(t, tc.want, want{other, successor, ok})
		})
	}
}
