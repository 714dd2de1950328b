package hostfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
	"golang.org/x/sys/unix"
)

func parseTestdata(t *testing.T, name string) Table {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	must.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	tbl, err := ParseMountInfo(f)
	must.NoError(t, err)
	return tbl
}

// The real table of a machine with a zfs-fuse pool and a dataset created
// with setuid=off,devices=off: the dataset's mount has neither flag.
func TestParseMountInfo_ZFSFuseCapture(t *testing.T) {
	tbl := parseTestdata(t, "mountinfo-zfs-fuse.txt")
	must.Len(t, 23, tbl)

	root, ok := tbl.At("/")
	must.True(t, ok)
	must.Eq(t, Mount{
		ID: 26, ParentID: 1, Major: 254, Minor: 0, Root: "/", MountPoint: "/",
		Options: []string{"rw", "relatime"}, FSType: "ext4", Source: "/dev/vda",
		SuperOptions: []string{"rw", "discard", "resv_strict", "resuid=65534", "resgid=65534"},
	}, root)

	slot, ok := tbl.At("/tmp/hostfs-cap.jcD6/mnt/slot")
	must.True(t, ok)
	must.Eq(t, Mount{
		ID: 43, ParentID: 42, Major: 0, Minor: 40, Root: "/", MountPoint: "/tmp/hostfs-cap.jcD6/mnt/slot",
		Options: []string{"rw", "relatime"}, FSType: "fuse.zfs", Source: "zfstestcap/slot",
		SuperOptions: []string{"rw", "user_id=0", "group_id=0", "default_permissions", "allow_other"},
	}, slot)
	must.False(t, slot.Satisfies(Flags{NoSUID: true}))
	must.False(t, slot.Satisfies(Flags{NoDev: true}))
	must.True(t, slot.Satisfies(Flags{}))

	kstat, ok := tbl.At("/zfs-kstat")
	must.True(t, ok)
	must.True(t, kstat.Satisfies(Flags{NoSUID: true, NoDev: true}))

	_, ok = tbl.At("/tmp/hostfs-cap.jcD6/mnt/slot/sub")
	must.False(t, ok)
	_, ok = tbl.At("/tmp/hostfs-cap.jcD6/mnt/slot/")
	must.False(t, ok, must.Sprint("At compares exactly; callers clean paths"))
}

func TestParseMountInfo_Handmade(t *testing.T) {
	tbl := parseTestdata(t, "mountinfo-handmade.txt")
	must.Len(t, 6, tbl)

	cases := []struct {
		at   string
		want Mount
	}{
		{
			at: "/srv/my slots",
			want: Mount{
				ID: 25, ParentID: 1, Major: 0, Minor: 40, Root: "/", MountPoint: "/srv/my slots",
				Options:  []string{"rw", "nosuid", "nodev", "noexec", "relatime"},
				Optional: []string{"shared:12", "master:3"},
				FSType:   "fuse.zfs", Source: "tank/nomad/my class",
				SuperOptions: []string{"rw", "user_id=0", "group_id=0", "default_permissions", "allow_other"},
			},
		},
		{
			at: "/srv/stacked", // the upper of two: the visible one
			want: Mount{
				ID: 27, ParentID: 26, Major: 0, Minor: 42, Root: "/", MountPoint: "/srv/stacked",
				Options:  []string{"ro", "nosuid", "nodev", "noatime", "nodiratime"},
				Optional: []string{"unbindable"},
				FSType:   "fuse.zfs", Source: "tank/nomad/scratch/1",
				SuperOptions: []string{"rw", "user_id=0", "group_id=0"},
			},
		},
		{
			at: "/srv/tab\tand\nnewline",
			want: Mount{
				ID: 28, ParentID: 1, Major: 0, Minor: 43, Root: `/sub\dir`, MountPoint: "/srv/tab\tand\nnewline",
				Options: []string{"rw"}, FSType: "tmpfs", Source: "none",
				SuperOptions: []string{"rw", "note=a,b"},
			},
		},
		{
			at: "/srv/strict", // empty source field
			want: Mount{
				ID: 29, ParentID: 1, Major: 0, Minor: 44, Root: "/", MountPoint: "/srv/strict",
				Options: []string{"rw", "nosymfollow", "idmapped"}, FSType: "tmpfs", Source: "",
				SuperOptions: []string{"rw"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.at, func(t *testing.T) {
			m, ok := tbl.At(tc.at)
			must.True(t, ok)
			must.Eq(t, tc.want, m)
		})
	}
	_, ok := tbl.At(`/srv/my\040slots`)
	must.False(t, ok, must.Sprint("mount points are compared unescaped"))
}

// At picks the mount on top of a stack, whatever order the kernel lists it.
func TestTableAt_Stacked(t *testing.T) {
	lower := Mount{ID: 30, ParentID: 1, MountPoint: "/s", Source: "lower"}
	upper := Mount{ID: 31, ParentID: 30, MountPoint: "/s", Source: "upper"}
	top := Mount{ID: 40, ParentID: 31, MountPoint: "/s", Source: "top"}
	other := Mount{ID: 32, ParentID: 30, MountPoint: "/s/child", Source: "child"}
	cases := []struct {
		name string
		tbl  Table
		want string
	}{
		{"listed in order", Table{lower, upper}, "upper"},
		{"listed upper first", Table{upper, lower}, "upper"},
		{"three, shuffled", Table{top, lower, other, upper}, "top"},
		{"one", Table{lower, other}, "lower"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := tc.tbl.At("/s")
			must.True(t, ok)
			must.Eq(t, tc.want, m.Source)
		})
	}
	_, ok := Table(nil).At("/s")
	must.False(t, ok)
}

// Of finds a source wherever it is mounted, and only there.
func TestTableOf(t *testing.T) {
	tbl := parseTestdata(t, "mountinfo-zfs-fuse.txt")
	cases := []struct {
		source string
		want   []string
	}{
		{"zfstestcap/slot", []string{"/tmp/hostfs-cap.jcD6/mnt/slot"}},
		{"zfstestcap/nothing", nil},
		{"zfstestcap/slo", nil},
	}
	for _, tc := range cases {
		t.Run(tc.source, func(t *testing.T) {
			var got []string
			for _, m := range tbl.Of(tc.source) {
				got = append(got, m.MountPoint)
			}
			must.Eq(t, tc.want, got)
		})
	}
	twice := Table{{ID: 30, MountPoint: "/a", Source: "p/d"}, {ID: 31, MountPoint: "/b", Source: "p/d"}, {ID: 32, MountPoint: "/c", Source: "p/e"}}
	must.SliceLen(t, 2, twice.Of("p/d"))
	must.Eq(t, "/b", twice.Of("p/d")[1].MountPoint)
}

func TestParseMountInfo_Malformed(t *testing.T) {
	good := "26 1 254:0 / / rw,relatime - ext4 /dev/vda rw"
	cases := []struct {
		name string
		line string
	}{
		{"empty line", ""},
		{"too few fields", "26 1 254:0 / / rw,relatime - ext4"},
		{"no separator", "26 1 254:0 / / rw,relatime shared:1 ext4 /dev/vda rw"},
		{"extra field after separator", "26 1 254:0 / / rw - ext4 /dev/vda rw extra"},
		{"separator too early", "26 1 254:0 / - rw ext4 /dev/vda rw x"},
		{"bad mount ID", "x 1 254:0 / / rw - ext4 /dev/vda rw"},
		{"negative parent", "26 -1 254:0 / / rw - ext4 /dev/vda rw"},
		{"no colon in dev", "26 1 2540 / / rw - ext4 /dev/vda rw"},
		{"bad minor", "26 1 254:x / / rw - ext4 /dev/vda rw"},
		{"bad escape", `26 1 254:0 / /a\09b rw - ext4 /dev/vda rw`},
		{"truncated escape", `26 1 254:0 / /a\04 rw - ext4 /dev/vda rw`},
		{"escape out of range", `26 1 254:0 / /a\777 rw - ext4 /dev/vda rw`},
		{"relative mount point", "26 1 254:0 / mnt rw - ext4 /dev/vda rw"},
		{"empty options", "26 1 254:0 / /  - ext4 /dev/vda rw"},
		{"empty fs type", "26 1 254:0 / / rw -  /dev/vda rw"},
		{"tabs for spaces", "26\t1 254:0 / / rw - ext4 /dev/vda rw"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := good + "\n" + good + "\n" + tc.line + "\n" + good + "\n"
			_, err := ParseMountInfo(strings.NewReader(in))
			var pe *ParseError
			must.True(t, errors.As(err, &pe), must.Sprintf("err = %v", err))
			must.Eq(t, 3, pe.Line)
			must.Eq(t, tc.line, pe.Text)
		})
	}
}

// Lines longer than bufio's default token size (overlayfs lowerdir lists)
// parse.
func TestParseMountInfo_LongLine(t *testing.T) {
	long := "1 0 0:50 / /o rw - overlay overlay rw,lowerdir=" + strings.Repeat("/l", 100_000)
	tbl, err := ParseMountInfo(strings.NewReader(long + "\n"))
	must.NoError(t, err)
	must.Len(t, 1, tbl)
	must.Len(t, 2, tbl[0].SuperOptions)
}

func TestRemountFlags(t *testing.T) {
	const base = unix.MS_REMOUNT | unix.MS_BIND
	both := Flags{NoSUID: true, NoDev: true}
	cases := []struct {
		name    string
		options string
		want    Flags
		flags   uintptr
	}{
		{"zfs-fuse default", "rw,relatime", both, base | unix.MS_RELATIME | unix.MS_NOSUID | unix.MS_NODEV},
		{"keeps ro noexec", "ro,noexec,relatime", both, base | unix.MS_RDONLY | unix.MS_NOEXEC | unix.MS_RELATIME | unix.MS_NOSUID | unix.MS_NODEV},
		{"keeps noatime nodiratime", "rw,noatime,nodiratime", Flags{NoDev: true}, base | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_NODEV},
		{"strictatime is kept", "rw", Flags{NoSUID: true}, base | unix.MS_STRICTATIME | unix.MS_NOSUID},
		{"never clears nosuid", "rw,nosuid,relatime", Flags{NoDev: true}, base | unix.MS_NOSUID | unix.MS_RELATIME | unix.MS_NODEV},
		{"keeps nosymfollow, idmapped is no flag", "rw,nosymfollow,idmapped,relatime", both, base | unix.MS_NOSYMFOLLOW | unix.MS_RELATIME | unix.MS_NOSUID | unix.MS_NODEV},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := remountFlags(Mount{Options: strings.Split(tc.options, ",")}, tc.want)
			must.NoError(t, err)
			must.Eq(t, tc.flags, got)
		})
	}
	_, err := remountFlags(Mount{Options: []string{"rw", "nofuture"}}, both)
	must.Error(t, err)
}

func TestFlagsFor(t *testing.T) {
	cases := []struct {
		props map[string]string
		want  Flags
	}{
		{nil, Flags{NoSUID: true, NoDev: true}},
		{map[string]string{"setuid": "off", "devices": "off"}, Flags{NoSUID: true, NoDev: true}},
		{map[string]string{"setuid": "on"}, Flags{NoDev: true}},
		{map[string]string{"devices": "on", "compression": "lz4"}, Flags{NoSUID: true}},
		{map[string]string{"setuid": "on", "devices": "on"}, Flags{}},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, FlagsFor(tc.props), must.Sprintf("props %v", tc.props))
	}
}
