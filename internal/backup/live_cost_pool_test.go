package backup_test

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// twoInUse makes a node with a zfs wrapper first on PATH, live backups
// every hour, and two datasets in use by two identities, each written.
func twoInUse(t *testing.T) (context.Context, *zfstest.Wrapper, *node) {
	t.Helper()
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	ctx, dir, a, _ := twoNodes(t)
	a.live(dir, time.Hour)
	ds0 := a.inUse(t, tenant(1))
	other := tenant(3)
	other.AllocName = "db.g[1]" // another identity
	ds1 := a.inUseAt(t, 1, other)
	for _, ds := range []string{ds0, ds1} {
		a.write(t, ds, 1)
	}
	return ctx, w, a
}

// TestBackup_ALivePassReadsOncePerClass: a live pass of a class with two
// datasets in use reads the class's datasets and their snapshots once
// each; per dataset it runs only what a live backup cannot share: its
// snapshot, the check after it that the name still serves the dataset the
// pass read in use (its GUID), the snapshot's GUID, and the send.
func TestBackup_ALivePassReadsOncePerClass(t *testing.T) {
	ctx, w, a := twoInUse(t)

	before := map[string]int{}
	for _, sub := range []string{"get", "snapshot", "send", "destroy", "list"} {
		before[sub] = w.Count(sub)
	}
	sent, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 2, sent)
	ran := map[string]int{}
	for sub, n := range before {
		ran[sub] = w.Count(sub) - n
	}
	const datasets = 2
	must.Eq(t, map[string]int{
		"get":      2 + 2*datasets, // the class's datasets and their snapshots; per dataset the check after its snapshot and its GUID
		"snapshot": datasets,
		"send":     datasets,
		"destroy":  0, // a first live backup leaves no older snapshot
		"list":     0,
	}, ran)
}
