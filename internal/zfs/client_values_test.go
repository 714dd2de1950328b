package zfs_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// A user property holding a TAB, a newline, or a forged block of another
// dataset does not stop Get from reading the others; the datasets that
// cannot be trusted carry Err, and GetExact reads their values exactly.
func TestClient_GetWithTabsAndNewlines(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	c := zfs.NewClient(pool.Runner)
	ctx := context.Background()
	root := pool.Dataset("p")
	ds := func(rel string) string { return root + "/" + rel }
	must.NoError(t, c.Create(ctx, root, nil))

	// Client.get asks for used, x:y and then name: the forgery imitates
	// exactly that, a complete block of victim and a last line of evil.
	forged := "v\tlocal\n" +
		ds("victim") + "\tused\t1\t-\n" +
		ds("victim") + "\tx:y\tstolen\tlocal\n" +
		ds("victim") + "\tname\t" + ds("victim") + "\t-\n" +
		ds("evil") + "\tx:y\tw"
	cases := []struct {
		rel, value string
		clean      bool
	}{
		{"a-clean", "plain", true},
		{"tab", "a\tb", true},
		{"newline", "a\nb", false},
		{"evil", forged, false},
		{"victim", "mine", false},
		{"z-clean", "plain", true},
	}
	for _, tc := range cases {
		must.NoError(t, c.Create(ctx, ds(tc.rel), nil))
		must.NoError(t, c.Set(ctx, ds(tc.rel), "x:y", tc.value))
	}

	got, err := c.Get(ctx, root, -1, "used", "x:y")
	must.NoError(t, err)
	byName := map[string]zfs.Dataset{}
	for _, d := range got {
		byName[d.Name] = d
	}
	must.MapLen(t, len(cases)+1, byName)
	must.NoError(t, byName[root].Err)
	for _, tc := range cases {
		t.Run(tc.rel, func(t *testing.T) {
			d := byName[ds(tc.rel)]
			_, asked := d.Props["name"]
			must.False(t, asked) // the sentinel is not handed out
			if tc.clean {
				must.NoError(t, d.Err)
				v, ok := d.Local("x:y")
				must.True(t, ok)
				must.Eq(t, tc.value, v)
			} else {
				must.ErrorIs(t, d.Err, zfs.ErrMalformed)
			}
			p, err := c.GetExact(ctx, ds(tc.rel), "x:y")
			must.NoError(t, err)
			must.Eq(t, zfs.Prop{Value: tc.value, Source: "local"}, p)
		})
	}

	// Asked for, "name" is handed out; a name given twice is read once.
	got, err = c.GetNames(ctx, []string{ds("tab"), ds("tab")}, "name", "x:y")
	must.NoError(t, err)
	must.SliceLen(t, 1, got)
	must.NoError(t, got[0].Err)
	must.Eq(t, ds("tab"), got[0].Props["name"].Value)

	_, err = c.GetExact(ctx, ds("missing"), "x:y")
	must.ErrorIs(t, err, zfs.ErrNotExist)
	_, err = c.GetExact(ctx, ds("tab"), "x:y,used")
	must.ErrorIs(t, err, zfs.ErrInvalid)
}

// SetMany on the real pool: every property ends up set, in one process where
// the ZFS takes several properties per `zfs set` (OpenZFS) and one per
// property where it does not (zfs-fuse), learned once per Client; failures
// keep their kind and are never taken for "unsupported".
func TestClient_SetMany(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	ctx := context.Background()
	ds := pool.Dataset("s")
	c := zfs.NewClient(pool.Runner)
	must.NoError(t, c.Create(ctx, ds, nil))
	two := map[string]string{"x:b": "2", "x:a": "1\tone"}

	before := pool.Runner.Runs()
	must.NoError(t, c.SetMany(ctx, ds, two))
	first := pool.Runner.Runs() - before
	multi := first == 1
	if !multi {
		must.Eq(t, 3, first) // the refused multi-property set, then one per property
	}
	t.Logf("multi-property zfs set supported: %v", multi)
	for k, v := range two {
		p, err := c.GetExact(ctx, ds, k)
		must.NoError(t, err)
		must.Eq(t, zfs.Prop{Value: v, Source: "local"}, p)
	}

	// The second call knows which form to use.
	before = pool.Runner.Runs()
	must.NoError(t, c.SetMany(ctx, ds, map[string]string{"x:a": "3", "x:b": "4"}))
	must.Eq(t, map[bool]int64{true: 1, false: 2}[multi], pool.Runner.Runs()-before)
	must.Eq(t, "3", pool.Prop(t, ds, "x:a"))
	must.Eq(t, "4", pool.Prop(t, ds, "x:b"))

	// One property is one `zfs set`; none is nothing.
	before = pool.Runner.Runs()
	must.NoError(t, c.SetMany(ctx, ds, map[string]string{"x:a": "5"}))
	must.NoError(t, c.SetMany(ctx, ds, nil))
	must.Eq(t, 1, pool.Runner.Runs()-before)

	// Failures on a fresh client, whose first multi-property set they are.
	cases := []struct {
		name    string
		dataset string
		props   map[string]string
		want    error
		unset   string // a property that must not have been written
	}{
		{"missing dataset", pool.Dataset("missing"), two, zfs.ErrNotExist, ""},
		{"bad value", ds, map[string]string{"compression": "no-such-algorithm", "x:c": "1"}, zfs.ErrInvalid, "x:c"},
		{"bad property name", ds, map[string]string{"-x": "1", "x:c": "1"}, zfs.ErrInvalid, "x:c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := zfs.NewClient(pool.Runner).SetMany(ctx, tc.dataset, tc.props)
			must.ErrorIs(t, err, tc.want)
			var zerr *zfs.Error
			must.True(t, errors.As(err, &zerr))
			if tc.unset != "" {
				must.Eq(t, "", pool.Prop(t, ds, tc.unset))
			}
		})
	}
}

// On a full pool SetMany fails with ErrNoSpace, on a fresh client (the
// multi-property attempt) as on one that knows the form.
func TestClient_SetManyNoSpace(t *testing.T) {
	pool := zfstest.NewPool(t, 64<<20)
	ctx := context.Background()
	ds := pool.Dataset("full")
	c := zfs.NewClient(pool.Runner)
	// compression=off: OpenZFS compresses by default (lz4 since 2.2).
	must.NoError(t, c.Create(ctx, ds, map[string]string{"compression": "off"}))
	must.NoError(t, c.SetMany(ctx, ds, map[string]string{"x:a": "1", "x:b": "2"})) // learn the form
	fillDataset(t, filepath.Join(pool.Mountpoint, "full"))

	// zfs-fuse refuses any write to a full pool, and says "out of
	// space". OpenZFS keeps a slop of the pool for changes like these and
	// may make them; where it refuses, it must read as ErrNoSpace too.
	_, kernel := os.Stat("/dev/zfs")
	noSpace := func(err error) {
		t.Helper()
		if kernel == nil && err == nil {
			return
		}
		must.ErrorIs(t, err, zfs.ErrNoSpace)
	}
	props := map[string]string{"x:a": "full", "x:b": "full"}
	noSpace(c.SetMany(ctx, ds, props))
	noSpace(zfs.NewClient(pool.Runner).SetMany(ctx, ds, props))
	noSpace(c.Create(ctx, pool.Dataset("more"), nil))
}

// What a ZFS with multi-property `zfs set` (OpenZFS; none on this machine)
// does, played by a small script: one process, and its failures (here the
// real OpenZFS text for a bad value) are returned, not taken for a refusal.
func TestClient_SetManyMultiPropertyZFS(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "args")
	stderr, err := os.ReadFile(filepath.Join("testdata", "set-bad-compression-openzfs-2.3.stderr"))
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(filepath.Join(dir, "stderr"), stderr, 0o644))
	script := writeScript(t, dir, "zfs", `echo "$*" >> '`+log+`'
case "$*" in *compression=*) cat '`+filepath.Join(dir, "stderr")+`' >&2; exit 255;; esac
`)
	r := &zfs.Runner{ZFS: script}
	c := zfs.NewClient(r)
	ctx := context.Background()

	must.ErrorIs(t, c.SetMany(ctx, "tank/a", map[string]string{"compression": "bogus", "x:a": "1"}), zfs.ErrInvalid)
	must.NoError(t, c.SetMany(ctx, "tank/a", map[string]string{"x:b": "2", "x:a": "1"}))
	must.NoError(t, c.SetMany(ctx, "tank/a", map[string]string{"x:c": "3", "x:d": "4"}))
	must.Eq(t, int64(3), r.Runs())
	b, err := os.ReadFile(log)
	must.NoError(t, err)
	must.Eq(t, []string{
		"set compression=bogus x:a=1 tank/a",
		"set x:a=1 x:b=2 tank/a",
		"set x:c=3 x:d=4 tank/a",
	}, strings.Split(strings.TrimSpace(string(b)), "\n"))
}

// fillDataset writes a file into dir until the pool is out of space.
func fillDataset(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	must.NoError(t, err)
	defer f.Close()
	// Random data: no compression, and no zero-block elision, shrinks it.
	buf := make([]byte, 1<<20)
	_, err = rand.Read(buf)
	must.NoError(t, err)
	for i := 0; i < 1<<12; i++ {
		if _, err := f.Write(buf); err != nil {
			must.True(t, strings.Contains(err.Error(), "no space left"), must.Sprintf("filling %s: %v", dir, err))
			return
		}
	}
	t.Fatalf("filling %s: still not full after 4 GiB", dir)
}
