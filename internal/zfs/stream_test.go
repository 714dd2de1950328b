package zfs

import (
	"os"
	"testing"

	"github.com/shoenig/test/must"
)

func TestParseSnapshots(t *testing.T) {
	out, err := os.ReadFile("testdata/get-snapshots-guid-zfs-fuse-0.7.txt")
	must.NoError(t, err)
	snaps, err := ParseSnapshots(out, "capt/nomad/.archive/renamed-by-hand")
	must.NoError(t, err)
	must.Eq(t, []Snap{
		{Name: "capt/nomad/.archive/renamed-by-hand@nomad-device-zfs-1", GUID: 16516471846059688789},
		{Name: "capt/nomad/.archive/renamed-by-hand@nomad-device-zfs-2", GUID: 4975178516661025827},
	}, snaps)

	cases := []struct{ name, out, wantErr string }{
		{"two fields", "a@s\tguid\n", "want 3 tab-separated fields"},
		{"another dataset", "b@s\tguid\t1\nb@s\tcreatetxg\t2\n", `"b@s" is not a or a snapshot of it`},
		{"not a number", "a@s\tguid\tx\n", `guid "x"`},
		{"missing createtxg", "a@s\tguid\t1\n", "want guid and createtxg, got 1"},
		{"unexpected property", "a@s\tused\t1\n", `unexpected property "used"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSnapshots([]byte(tc.out), "a")
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
}
