package backup

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

func TestChain(t *testing.T) {
	m := func(guid, base uint64, mins int) Manifest {
		return Manifest{GUID: guid, BaseGUID: base, Created: time.Unix(int64(mins)*60, 0), path: "/b/" + itoa(guid) + ".json"}
	}
	guids := func(ms []Manifest) []uint64 {
		var out []uint64
		for _, x := range ms {
			out = append(out, x.GUID)
		}
		return out
	}
	cases := []struct {
		name    string
		ms      []Manifest // newest first, as List returns them
		want    []uint64
		wantErr string
	}{
		{"full only", []Manifest{m(1, 0, 1)}, []uint64{1}, ""},
		{"full and two incrementals", []Manifest{m(3, 2, 3), m(2, 1, 2), m(1, 0, 1)}, []uint64{1, 2, 3}, ""},
		{"a newer full restarts the chain", []Manifest{m(4, 0, 4), m(3, 2, 3), m(2, 1, 2), m(1, 0, 1)}, []uint64{4}, ""},
		{"base missing", []Manifest{m(3, 2, 3), m(1, 0, 1)}, nil, "the chain of /b/3.json is broken: its base (snapshot GUID 2)"},
		{"loop", []Manifest{m(2, 1, 2), m(1, 2, 1)}, nil, "loops"},
		{"nothing", nil, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Chain(tc.ms)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, guids(got))
		})
	}
}

func TestList_ProblemsAndOthersFiles(t *testing.T) {
	dir := t.TempDir()
	id := retention.Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Class: "state"}
	idDir := IdentityDir(dir, id)
	must.NoError(t, os.MkdirAll(idDir, 0o700))
	good := `{"kind":"nomad-device-zfs-backup","version":1,"guid":7,"stream":"a.zstream","sha256":"` + sixtyFour + `","created":"2026-11-24T00:00:00Z"}`
	for name, text := range map[string]string{
		"good.json":    good,
		"broken.json":  "{",
		"foreign.json": `{"kind":"something-else","version":1}`,
		"future.json":  `{"kind":"nomad-device-zfs-backup","version":2}`,
		"escape.json":  `{"kind":"nomad-device-zfs-backup","version":1,"guid":7,"stream":"../x","sha256":"` + sixtyFour + `"}`,
		"notes.txt":    "not a manifest",
	} {
		must.NoError(t, os.WriteFile(filepath.Join(idDir, name), []byte(text), 0o600))
	}
	ms, problems, err := List(dir, nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, ms)
	must.Eq(t, filepath.Join(idDir, "good.json"), ms[0].Path())
	must.Eq(t, filepath.Join(idDir, "a.zstream"), ms[0].StreamPath())
	must.SliceLen(t, 4, problems)

	_, _, err = List(filepath.Join(dir, "missing"), nil)
	must.ErrorContains(t, err, "backup_dir")
	// A backup_dir without the plugin's directory (a share that is not
	// mounted) is not "no backups".
	empty := t.TempDir()
	_, _, err = List(empty, &id)
	must.ErrorContains(t, err, "is it mounted?")
	must.NoError(t, EnsureRoot(empty))
	ms, _, err = List(empty, &id)
	must.NoError(t, err)
	must.SliceEmpty(t, ms)
}

const sixtyFour = "0000000000000000000000000000000000000000000000000000000000000000"

func itoa(n uint64) string {
	return string(rune('0' + n))
}
