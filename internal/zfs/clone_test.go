package zfs_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// A clone starts with the snapshot's files and the properties asked for,
// records the snapshot as its origin, and holds the snapshot until it is
// destroyed; a write to the clone reaches neither the snapshot nor its
// dataset.
func TestClient_CloneRealPool(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	c := zfs.NewClient(pool.Runner)
	ctx := context.Background()
	golden, clone := pool.Dataset("golden"), pool.Dataset("clone")
	must.NoError(t, c.Create(ctx, golden, nil))
	must.NoError(t, os.WriteFile(filepath.Join(pool.Prop(t, golden, "mountpoint"), "seed.txt"), []byte("v1"), 0o644))
	must.NoError(t, c.Snapshot(ctx, golden+"@v1"))

	must.NoError(t, c.Clone(ctx, golden+"@v1", clone, map[string]string{"refquota": "33554432", "com.example:x": "1"}))
	ds, err := c.GetNames(ctx, []string{clone}, "origin", "refquota", "com.example:x", "mountpoint")
	must.NoError(t, err)
	origin, _ := ds[0].Value("origin")
	must.Eq(t, golden+"@v1", origin)
	q, _ := ds[0].Value("refquota")
	must.Eq(t, "33554432", q)
	x, _ := ds[0].Local("com.example:x")
	must.Eq(t, "1", x)
	mp, _ := ds[0].Value("mountpoint")
	b, err := os.ReadFile(filepath.Join(mp, "seed.txt"))
	must.NoError(t, err)
	must.Eq(t, "v1", string(b))
	must.NoError(t, os.WriteFile(filepath.Join(mp, "seed.txt"), []byte("tenant"), 0o644))
	b, err = os.ReadFile(filepath.Join(pool.Prop(t, golden, "mountpoint"), "seed.txt"))
	must.NoError(t, err)
	must.Eq(t, "v1", string(b))

	// The snapshot cannot go while the clone exists; then it can.
	_, err = pool.Runner.ZFSCmd(ctx, "destroy", golden+"@v1")
	must.Error(t, err)
	must.NoError(t, c.Destroy(ctx, clone))
	must.NoError(t, c.Destroy(ctx, golden+"@v1"))

	for _, bad := range []struct{ snap, name string }{{golden, clone}, {golden + "@", clone}, {golden + "@v1", "-o"}} {
		must.ErrorIs(t, c.Clone(ctx, bad.snap, bad.name, nil), zfs.ErrInvalid)
	}
}
