package zfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// captureEnv, set to 1, makes TestCaptureTestdata (re)write the zfs-fuse
// files of testdata/ that it produces; see testdata/README.md.
const captureEnv = "NDZ_CAPTURE_TESTDATA"

// getValuesProps is the property list of the get-values-* captures: two user
// properties, the value of the first one being the test's subject, and
// "name" last, as Client.get asks for it.
var getValuesProps = []string{"mounted", "used", "x:y", "x:z", "name"}

// TestCaptureTestdata is not a test but the recipe of several testdata files:
// it runs real commands on a zfs-fuse pool and saves what they print.
func TestCaptureTestdata(t *testing.T) {
	testenv.OptIn(t, captureEnv, "rewrite the captured testdata")
	ctx := context.Background()
	pool := zfstest.NewPool(t, 64<<20)
	r := pool.Runner
	zfsOut := func(args ...string) []byte {
		t.Helper()
		out, err := r.ZFSCmd(ctx, args...)
		must.NoError(t, err)
		return out
	}
	zfsErr := func(args ...string) string {
		t.Helper()
		_, err := r.ZFSCmd(ctx, args...)
		var zerr *zfs.Error
		must.True(t, errors.As(err, &zerr), must.Sprintf("zfs %v: want a failure, got %v", args, err))
		return zerr.Stderr + "\n"
	}
	save := func(name string, b []byte) {
		t.Helper()
		must.NoError(t, os.WriteFile(filepath.Join("testdata", name), b, 0o644))
	}

	root := pool.Dataset("nomad")
	ds := func(rel string) string { return root + "/" + rel }
	zfsOut("create", root)
	// Every value goes in as one argument: no shell between us and zfs.
	values := map[string]string{
		"blank":   "\n\nq",
		"clean0":  "plain",
		"newline": "a\nb",
		"tab":     "a\tb",
		"tabnl":   "a\tb\nc",
		"zclean":  "plain",
		"victim":  "mine",
		// A forged, complete block of victim (which sorts after evil, so
		// that its real block comes later), then a last line of evil's own.
		"evil": "v\tlocal\n" + forgedBlock(ds("victim"), "stolen") + ds("evil") + "\tx:z\tforged",
	}
	for rel, v := range values {
		zfsOut("create", ds(rel))
		zfsOut("set", "x:y="+v, ds(rel))
	}
	// evil2 forges a dataset that does not exist, from its last user
	// property: a block of phantom that is complete when "name" is not
	// asked for (its last line takes evil2's real source).
	zfsOut("create", ds("evil2"))
	zfsOut("set", "x:y=ok", ds("evil2"))
	phantom := forgedBlock(ds("phantom"), "free")
	phantom = phantom[:strings.Index(phantom, ds("phantom")+"\tx:z\t")] + ds("phantom") + "\tx:z\t-"
	zfsOut("set", "x:z=w\tlocal\n"+phantom, ds("evil2"))
	zfsOut("snapshot", ds("newline")+"@s")

	save("get-values-zfs-fuse-0.7.txt", zfsOut("get", "-H", "-p", "-o", "name,property,value,source",
		strings.Join(getValuesProps, ","), "-r", root))
	save("get-forged-noname-zfs-fuse-0.7.txt", zfsOut("get", "-H", "-p", "-o", "name,property,value,source",
		strings.Join(getValuesProps[:len(getValuesProps)-1], ","), "-r", ds("evil2")))
	save("getexact-tabnl-zfs-fuse-0.7.txt", zfsOut("get", "-H", "-p", "-o", "value,source", "x:y", ds("tabnl")))
	save("getexact-evil-zfs-fuse-0.7.txt", zfsOut("get", "-H", "-p", "-o", "value,source", "x:y", ds("evil")))
	save("getexact-unset-zfs-fuse-0.7.txt", zfsOut("get", "-H", "-p", "-o", "value,source", "x:unset", ds("tab")))

	// zfs-fuse reads every "k=v" after the first as a dataset name.
	save("set-multi-zfs-fuse-0.7.stderr", []byte(zfsErr("set", "x:a=1", "x:b=2", ds("clean0"))))

	// Fill the pool, then write metadata.
	f, err := os.Create(filepath.Join(pool.Mountpoint, "nomad", "clean0", "fill"))
	must.NoError(t, err)
	buf := make([]byte, 1<<20)
	for err == nil {
		_, err = f.Write(buf)
	}
	t.Logf("filling stopped at: %v", err)
	must.NoError(t, f.Close())
	save("nospace-set-zfs-fuse-0.7.stderr", []byte(zfsErr("set", "x:q=full", ds("clean0"))))
	save("nospace-create-zfs-fuse-0.7.stderr", []byte(zfsErr("create", ds("new"))))
	save("nospace-set-multi-zfs-fuse-0.7.stderr", []byte(zfsErr("set", "x:q=full", "x:r=full", ds("clean0"))))
}

// forgedBlock is the text of a complete getValuesProps block of name, as zfs
// would print it.
func forgedBlock(name, state string) string {
	return name + "\tmounted\tyes\t-\n" +
		name + "\tused\t21504\t-\n" +
		name + "\tx:y\t" + state + "\tlocal\n" +
		name + "\tx:z\t-\t-\n" +
		name + "\tname\t" + name + "\t-\n"
}
