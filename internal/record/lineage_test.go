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

func TestSuperseded(t *testing.T) {
	cases := []struct {
		name string
		left []record.Left
		want map[string]bool
	}{
		{"none restored", []record.Left{{AllocID: allocA}, {AllocID: allocB}}, map[string]bool{}},
		{"B restored from A", []record.Left{{AllocID: allocA}, {AllocID: allocB, From: record.Lineage{allocA}}}, map[string]bool{allocA: true}},
		{"C from B from A, B's gone", []record.Left{{AllocID: allocA}, {AllocID: allocC, From: record.Lineage{allocB, allocA}}}, map[string]bool{allocA: true, allocB: true}},
		{"own lineage does not count", []record.Left{{AllocID: allocA, From: record.Lineage{allocA}}}, map[string]bool{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, record.Superseded(tc.left))
		})
	}
}
