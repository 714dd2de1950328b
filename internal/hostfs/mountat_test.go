package hostfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// ParseMountInfoAt finds, on saved real tables, exactly what a full parse
// finds at every mount point they list, and nothing at other paths.
func TestParseMountInfoAt_SameAsFullParse(t *testing.T) {
	for _, name := range []string{"mountinfo-zfs-fuse.txt", "mountinfo-handmade.txt"} {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", name))
			must.NoError(t, err)
			full, err := ParseMountInfo(strings.NewReader(string(b)))
			must.NoError(t, err)
			paths := []string{"/nowhere", "/tmp"}
			for _, m := range full {
				paths = append(paths, m.MountPoint)
			}
			for _, p := range paths {
				at, err := ParseMountInfoAt(strings.NewReader(string(b)), p)
				must.NoError(t, err)
				for _, m := range at {
					must.Eq(t, p, m.MountPoint)
				}
				want, wantOK := full.At(p)
				got, gotOK := at.At(p)
				must.Eq(t, wantOK, gotOK, must.Sprintf("path %q", p))
				must.Eq(t, want, got, must.Sprintf("path %q", p))
			}
		})
	}
}

// Mounts stacked at one path, listed in any order, and an escaped mount
// point. A malformed line at the path is refused as a full parse refuses
// it; one elsewhere only when its mount point cannot be read (too few
// fields, a bad escape), and the error names its line.
func TestParseMountInfoAt_Cases(t *testing.T) {
	const (
		lower = "30 1 0:40 / /s rw,relatime - fuse.zfs p/lower rw"
		upper = "31 30 0:41 / /s rw,nosuid,nodev,relatime - fuse.zfs p/upper rw"
		child = "32 30 0:42 / /s/child rw - fuse.zfs p/child rw"
		space = `33 1 0:43 / /srv/my\040slots rw - zfs p/space rw`
	)
	cases := []struct {
		name    string
		text    string
		path    string
		want    string // the source of At(path), "" for none
		wantErr string // in the ParseError's reason
		errLine int    // the ParseError's line
	}{
		{name: "upper listed second", text: lower + "\n" + child + "\n" + upper, path: "/s", want: "p/upper"},
		{name: "upper listed first", text: upper + "\n" + lower, path: "/s", want: "p/upper"},
		{name: "the child", text: lower + "\n" + child + "\n" + upper, path: "/s/child", want: "p/child"},
		{name: "escaped", text: lower + "\n" + space, path: "/srv/my slots", want: "p/space"},
		{name: "escaped, compared unescaped", text: space, path: `/srv/my\040slots`},
		{name: "not there", text: lower, path: "/t"},
		{name: "short line elsewhere", text: lower + "\n30 1 0:40 /", path: "/s", wantErr: "fewer than 6 fields", errLine: 2},
		{name: "bad escape elsewhere", text: `34 1 0:44 / /x\9 rw - zfs p/x rw` + "\n" + lower, path: "/s", wantErr: "mount point", errLine: 1},
		{name: "malformed at the path", text: "35 1 0:45 / /s rw x zfs p/y rw", path: "/s", wantErr: "separator", errLine: 1},
		{name: "malformed elsewhere, skipped", text: "35 1 0:45 / /y rw zfs p/y rw\n" + lower, path: "/s", want: "p/lower"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tbl, err := ParseMountInfoAt(strings.NewReader(tc.text), tc.path)
			if tc.wantErr != "" {
				var pe *ParseError
				must.True(t, errors.As(err, &pe), must.Sprintf("error %v", err))
				must.Eq(t, tc.errLine, pe.Line)
				must.StrContains(t, pe.Reason, tc.wantErr)
				return
			}
			must.NoError(t, err)
			m, ok := tbl.At(tc.path)
			must.Eq(t, tc.want != "", ok)
			must.Eq(t, tc.want, m.Source)
		})
	}
}

// ReadTableAt reads this machine's table: the root is mounted at "/".
func TestReadTableAt_Root(t *testing.T) {
	tbl, err := ReadTableAt("/")
	must.NoError(t, err)
	m, ok := tbl.At("/")
	must.True(t, ok)
	must.Eq(t, "/", m.MountPoint)
}

// bigTable is the zfs-fuse capture's lines ten times over, each copy's
// mount points moved under its own directory: 230 lines, about what the
// churn of `make bench` leaves in a node's table.
func bigTable(b *testing.B) ([]byte, string) {
	b.Helper()
	capture, err := os.ReadFile(filepath.Join("testdata", "mountinfo-zfs-fuse.txt"))
	must.NoError(b, err)
	var out strings.Builder
	for i := range 10 {
		for _, line := range strings.Split(strings.TrimSpace(string(capture)), "\n") {
			f := strings.Split(line, " ")
			f[4] = "/copy" + strconv.Itoa(i) + f[4]
			out.WriteString(strings.Join(f, " ") + "\n")
		}
	}
	return []byte(out.String()), "/copy9/tmp/hostfs-cap.jcD6/mnt/slot"
}

// The cost of a Reserve's mount check on a node with a few hundred
// mounts: the whole table parsed, then only the lines at one path.
func BenchmarkParseMountInfo(b *testing.B) {
	text, path := bigTable(b)
	for b.Loop() {
		tbl, err := ParseMountInfo(bytes.NewReader(text))
		must.NoError(b, err)
		_, ok := tbl.At(path)
		must.True(b, ok)
	}
}

func BenchmarkParseMountInfoAt(b *testing.B) {
	text, path := bigTable(b)
	for b.Loop() {
		tbl, err := ParseMountInfoAt(bytes.NewReader(text), path)
		must.NoError(b, err)
		_, ok := tbl.At(path)
		must.True(b, ok)
	}
}

// Reading this machine's table, which the kernel writes out at each read:
// what a check costs beyond the parse (it grows with the node's mounts).
func BenchmarkReadMountInfo(b *testing.B) {
	for b.Loop() {
		_, err := os.ReadFile(MountInfoPath)
		must.NoError(b, err)
	}
}
