package zfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	must.NoError(t, err)
	return b
}

// savedProps is the property list of the get-*.txt captures (the plugin's
// observed properties when they were made).
var savedProps = []string{"mounted", "mountpoint", "used", "available", "referenced", "compressratio", "refquota",
	"nomad-device-zfs:managed", "nomad-device-zfs:state"}

func TestParseGet_SavedOutput(t *testing.T) {
	cases := []struct {
		file      string
		names     []string
		check     string // a slot dataset to inspect
		state     string
		mounted   string
		used      uint64
		ratio     float64
		refquota  uint64
		stateSrc  string
		inherited string // a dataset whose managed mark is inherited, not local
	}{
		{
			file:  "get-zfs-fuse-0.7.txt",
			names: []string{"ztest/nomad", "ztest/nomad/foreign", "ztest/nomad/scratch", "ztest/nomad/scratch/0", "ztest/nomad/scratch/1", "ztest/nomad/scratch/2"},
			check: "ztest/nomad/scratch/1", state: "reserved", mounted: "yes", used: 1433600, ratio: 1.0, refquota: 10485760,
			stateSrc: "local", inherited: "ztest/nomad/scratch/2",
		},
		{
			file:  "get-openzfs-2.2.txt",
			names: []string{"tank/nomad", "tank/nomad/scratch", "tank/nomad/scratch/0", "tank/nomad/scratch/1"},
			check: "tank/nomad/scratch/0", state: "reserved", mounted: "yes", used: 237568, ratio: 2.41, refquota: 10485760,
			stateSrc: "local",
		},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			ds, err := ParseGet(readTestdata(t, tc.file), savedProps)
			must.NoError(t, err)
			var names []string
			byName := map[string]Dataset{}
			for _, d := range ds {
				must.NoError(t, d.Err)
				names = append(names, d.Name)
				byName[d.Name] = d
			}
			must.Eq(t, tc.names, names)

			d := byName[tc.check]
			v, ok := d.Local("nomad-device-zfs:state")
			must.True(t, ok)
			must.Eq(t, tc.state, v)
			must.Eq(t, tc.stateSrc, d.Props["nomad-device-zfs:state"].Source)
			mounted, _ := d.Value("mounted")
			must.Eq(t, tc.mounted, mounted)
			used, err := d.Bytes("used")
			must.NoError(t, err)
			must.Eq(t, tc.used, used)
			q, err := d.Bytes("refquota")
			must.NoError(t, err)
			must.Eq(t, tc.refquota, q)
			r, _ := d.Value("compressratio")
			ratio, err := ParseRatio(r)
			must.NoError(t, err)
			must.Eq(t, tc.ratio, ratio)

			if tc.inherited != "" {
				inh := byName[tc.inherited]
				_, local := inh.Local("nomad-device-zfs:managed")
				must.False(t, local)
				v, ok := inh.Value("nomad-device-zfs:managed")
				must.True(t, ok)
				must.Eq(t, "class", v)
			}
			// An unset user property reads as absent, not as "-".
			_, ok = byName[tc.names[0]].Value("nomad-device-zfs:state")
			must.False(t, ok)
		})
	}
}

func TestParseGet_DropsSnapshots(t *testing.T) {
	ds, err := ParseGet(readTestdata(t, "get-snapshots-zfs-fuse-0.7.txt"), savedProps)
	must.NoError(t, err)
	must.SliceLen(t, 1, ds)
	must.Eq(t, "ztest/nomad/scratch/1", ds[0].Name)
	must.NoError(t, ds[0].Err)
}

// Output that cannot be zfs get output at all is an error; a line that goes
// wrong later only taints the dataset it belongs to.
func TestParseGet_Malformed(t *testing.T) {
	cases := []struct {
		name, in string
		props    []string
		wantErr  string // error of the whole parse
		bad      string // else: the one dataset with Err
		value    string // else: the value of used of tank/a
	}{
		{name: "no properties", in: "tank/a\tused\t1\t-\n", wantErr: "no properties"},
		{name: "two fields", in: "tank/a\tused\n", props: []string{"used"}, wantErr: "line 1 is not"},
		{name: "spaces not tabs", in: "tank/a used 1 -\n", props: []string{"used"}, wantErr: "line 1 is not"},
		{name: "empty name", in: "\tused\t1\t-\n", props: []string{"used"}, wantErr: "line 1 is not"},
		{name: "property not asked for", in: "tank/a\tavail\t1\t-\n", props: []string{"used"}, wantErr: "line 1 is not"},
		{name: "three fields", in: "tank/a\tused\t1\n", props: []string{"used"}, bad: "tank/a"},
		{name: "five fields: TAB in the value", in: "tank/a\tused\t1\t-\textra\n", props: []string{"used"}, value: "1\t-"},
		{name: "second line bad", in: "tank/a\tused\t1\t-\ngarbage\n", props: []string{"used"}, bad: "tank/a"},
		{name: "empty line", in: "tank/a\tused\t1\t-\n\n", props: []string{"used"}, bad: "tank/a"},
		{name: "incomplete at the end", in: "tank/a\tused\t1\t-\n", props: []string{"used", "x:y"}, bad: "tank/a"},
		{name: "out of order", in: "tank/a\tx:y\t1\t-\ntank/a\tused\t1\t-\n", props: []string{"used", "x:y"}, bad: "tank/a"},
		{name: "name property not its name", in: "tank/a\tused\t1\t-\ntank/a\tname\ttank/b\t-\n", props: []string{"used", "name"}, bad: "tank/a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := ParseGet([]byte(tc.in), tc.props)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.SliceLen(t, 1, ds)
			must.Eq(t, "tank/a", ds[0].Name)
			if tc.bad != "" {
				must.ErrorIs(t, ds[0].Err, ErrMalformed)
				must.StrContains(t, ds[0].Err.Error(), tc.bad)
				return
			}
			must.NoError(t, ds[0].Err)
			v, _ := ds[0].Value("used")
			must.Eq(t, tc.value, v)
		})
	}
}

func TestParseGet_EmptyValue(t *testing.T) {
	ds, err := ParseGet([]byte("tank/a\tcomment:x\t\tlocal\n"), []string{"comment:x"})
	must.NoError(t, err)
	must.SliceLen(t, 1, ds)
	must.NoError(t, ds[0].Err)
	v, ok := ds[0].Local("comment:x")
	must.True(t, ok)
	must.Eq(t, "", v)
}

func TestDatasetBytes_Errors(t *testing.T) {
	d := Dataset{Name: "tank/a", Props: map[string]Prop{"used": {Value: "12x", Source: "-"}, "avail": {Value: "-", Source: "-"}}}
	_, err := d.Bytes("used")
	must.ErrorContains(t, err, `"12x" is not a number of bytes`)
	_, err = d.Bytes("avail")
	must.ErrorContains(t, err, "not set")
	_, err = d.Bytes("nope")
	must.ErrorContains(t, err, "not set")
}

func TestParsePoolHealth(t *testing.T) {
	cases := []struct {
		file, pool, want string
	}{
		{"zpool-list-zfs-fuse-0.7.txt", "ztest", "ONLINE"},
		{"zpool-list-openzfs-2.2.txt", "tank", "DEGRADED"},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			h, err := ParsePoolHealth(readTestdata(t, tc.file), tc.pool)
			must.NoError(t, err)
			must.Eq(t, tc.want, h)
		})
	}
	_, err := ParsePoolHealth([]byte("tank ONLINE\n"), "tank")
	must.ErrorContains(t, err, "want 2 tab-separated fields")
	_, err = ParsePoolHealth([]byte("other\tONLINE\n"), "tank")
	must.ErrorContains(t, err, `no line for pool "tank"`)
}

func TestParseRatio(t *testing.T) {
	cases := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"1.00x", 1, true}, {"2.41", 2.41, true}, {"x", 0, false}, {"", 0, false}, {"-1.0x", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseRatio(tc.in)
		if !tc.ok {
			must.Error(t, err)
			continue
		}
		must.NoError(t, err)
		must.Eq(t, tc.want, got)
	}
}

func TestParseSize(t *testing.T) {
	cases := []struct {
		in      string
		want    uint64
		wantErr string
	}{
		{"1024", 1024, ""},
		{"10G", 10 << 30, ""},
		{"10GiB", 10 << 30, ""},
		{"10gb", 10 << 30, ""},
		{"512M", 512 << 20, ""},
		{"1.5K", 1536, ""},
		{"2T", 2 << 40, ""},
		{" 4 MiB ", 4 << 20, ""},
		{"", 0, "empty"},
		{"0", 0, "greater than zero"},
		{"1.5", 0, "whole number of bytes"},
		{"10Q", 0, "unknown unit"},
		{"GiB", 0, "does not start with a number"},
		{"-1G", 0, "does not start with a number"},
		{"1..2G", 0, "is not a number"},
		{"99999E", 0, "too large"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
}

func TestValidateDatasetName(t *testing.T) {
	cases := []struct {
		in string
		ok bool
	}{
		{"tank/nomad", true}, {"tank", true}, {"tank/a-b_c.d:e", true},
		{"", false}, {"-tank", false}, {"tank//a", false}, {"tank/", false}, {"tank/a@snap", false},
		{"tank/../x", false}, {"tank/a b", false}, {"tank/a;rm", false},
	}
	for _, tc := range cases {
		err := ValidateDatasetName(tc.in)
		must.Eq(t, tc.ok, err == nil, must.Sprintf("name %q: err %v", tc.in, err))
	}
}

func TestPoolOf(t *testing.T) {
	must.Eq(t, "tank", PoolOf("tank/a/b"))
	must.Eq(t, "tank", PoolOf("tank"))
}
