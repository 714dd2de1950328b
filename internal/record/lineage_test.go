package record_test

import (
	"strings"
	"testing"

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
	type want struct {
		other     string
		successor bool
		ok        bool
	}
	cases := []struct {
		name   string
		left   []record.Left
		newest string
		want   want
	}{
		{"nothing restored", []record.Left{{AllocID: allocA}, {AllocID: allocB}}, allocB, want{}},
		{"B restored from A and is newest: the ordinary move", []record.Left{{AllocID: allocA}, {AllocID: allocB, From: record.Lineage{allocA}}}, allocB, want{}},
		{"C from B from A, C newest", []record.Left{{AllocID: allocA}, {AllocID: allocB, From: record.Lineage{allocA}}, {AllocID: allocC, From: record.Lineage{allocB, allocA}}}, allocC, want{}},
		{"A newest, B restored from it: a late release", []record.Left{{AllocID: allocA}, {AllocID: allocB, From: record.Lineage{allocA}}}, allocA, want{allocB, true, true}},
		{"A newest, C descends from it through B, B's gone", []record.Left{{AllocID: allocA}, {AllocID: allocC, From: record.Lineage{allocB, allocA}}}, allocA, want{allocC, true, true}},
		{"B newest, C from B and A: B late", []record.Left{{AllocID: allocB, From: record.Lineage{allocA}}, {AllocID: allocC, From: record.Lineage{allocB, allocA}}}, allocB, want{allocC, true, true}},
		{"B and C both from A, B newest: siblings", []record.Left{{AllocID: allocA}, {AllocID: allocB, From: record.Lineage{allocA}}, {AllocID: allocC, From: record.Lineage{allocA}}}, allocB, want{allocC, false, true}},
		{"siblings with A gone", []record.Left{{AllocID: allocC, From: record.Lineage{allocA}}, {AllocID: allocB, From: record.Lineage{allocA}}}, allocC, want{allocB, false, true}},
		{"D from C from A, B from A older: D descends from C, B's sibling is C", []record.Left{{AllocID: allocB, From: record.Lineage{allocA}}, {AllocID: allocC, From: record.Lineage{allocA}}, {AllocID: allocD, From: record.Lineage{allocC, allocA}}}, allocD, want{}},
		{"own lineage does not count", []record.Left{{AllocID: allocA, From: record.Lineage{allocA}}}, allocA, want{}},
		{"an unknown allocation is never a fork", []record.Left{{AllocID: ""}, {AllocID: allocB, From: record.Lineage{allocA}}}, allocB, want{}},
		{"an unknown newest forks nothing", []record.Left{{AllocID: allocB, From: record.Lineage{allocA}}}, "", want{}},
		{"the same allocation twice (two slots, a local archive and its stream)", []record.Left{{AllocID: allocB, From: record.Lineage{allocA}}, {AllocID: allocB, From: record.Lineage{allocA}}, {AllocID: allocA}}, allocB, want{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			other, successor, ok := record.Diverged(tc.left, tc.newest)
			must.Eq(t, tc.want, want{other, successor, ok})
		})
	}
}
