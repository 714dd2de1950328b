package backup_test

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestBackup_ALateReleaseOfALostNodesAllocationIsNotTheNewestData: A runs
// on node a with live backups; a is lost. Its replacement B restores A's
// last live backup on node b (its dataset records that its data came from
// A), writes, and is released: its final stream goes to backup_dir. Then a
// comes back and releases A: A's final stream is written last, its archive
// on a is the only local one. The identity's newest data is still B's:
// backup_dir ranks B's streams first, a restore on a third node takes
// them, a restore on a (whose local archive is A's) receives them rather
// than take A's, and retention on a ranks B's archive first once it is
// there. On b, B's own archive stays the newest.
func TestBackup_ALateReleaseOfALostNodesAllocationIsNotTheNewestData(t *testing.T) {
	ctx, dir, a, b := twoNodes(t)
	c := newNode(t, dir)
	saved := backup.LiveSettle
	backup.LiveSettle = 200 * time.Millisecond
	t.Cleanup(func() { backup.LiveSettle = saved })
	for _, n := range []*node{a, b, c} {
		n.keeper.SetConfig(backup.Config{Dir: dir, Container: n.cfg.ArchiveDataset(), Classes: map[string]bool{"state": true},
			Live: map[string]time.Duration{"state": time.Millisecond}, ClassDatasets: map[string]string{"state": n.cfg.ClassDataset("state")}})
	}
	allocA, allocB := tenant(1), tenant(2)

	// A on node a: a live backup, then a is lost.
	dsA := a.inUse(t, allocA)
	a.write(t, dsA, 2)
	sent, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)

	// B restores it on node b, as restoreInto leaves a slot: reserved for
	// B, its data's lineage recorded. B writes, is backed up live, and is
	// released.
	got, err := b.keeper.Fetch(ctx, "state", allocB, retention.Archive{})
	must.NoError(t, err)
	must.NotEq(t, "", got)
	b.pool.ZFS(t, "create", "-p", b.cfg.ClassDataset("state"))
	dsB := b.cfg.ClassDataset("state") + "/0"
	b.pool.ZFS(t, "rename", got, dsB)
	for _, p := range [][2]string{
		{record.PropState, string(record.StateReserved)}, {record.PropOwner, allocB.Encode()},
		{record.PropBackup, record.BackupNone}, {record.PropDataFrom, record.Lineage(nil).Descend(allocA.AllocID).Encode()},
	} {
		b.pool.ZFS(t, "set", p[0]+"="+p[1], dsB)
	}
	b.write(t, dsB, 1)
	sent, _, err = b.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.Eq(t, record.Lineage{allocA.AllocID}, sent[0].From, must.Sprint("B's live backup carries its data's lineage"))
	b.write(t, dsB, 1)
	dataB := b.sum(t, dsB)
	archB := b.release(t, dsB, allocB)
	sent, _, err = b.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)

	// Node a comes back: A wrote on meanwhile, and is released late. Its
	// final stream is the last written.
	time.Sleep(1100 * time.Millisecond) // its archive's name: a later second
	a.write(t, dsA, 1)
	dataA := a.sum(t, dsA)
	archA := a.release(t, dsA, allocA)
	sent, _, err = a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.EqOp(t, allocA.AllocID, sent[0].AllocID)
	must.NotEq(t, dataA, dataB)

	// backup_dir ranks B's data first, however late A's stream came.
	id := retention.IdentityOf("state", allocB)
	ms, _, err := backup.List(dir, &id)
	must.NoError(t, err)
	must.EqOp(t, allocB.AllocID, ms[0].AllocID, must.Sprint("the successor's stream is the newest data"))
	must.EqOp(t, allocA.AllocID, ms[len(ms)-1].AllocID, must.Sprint("the late release ranks last"))

	// A third node restores B's data.
	got, err = c.keeper.Fetch(ctx, "state", tenant(3), retention.Archive{})
	must.NoError(t, err)
	must.EqOp(t, dataB, c.sum(t, got), must.Sprint("a restore elsewhere takes B's data"))

	// Node a, whose one local archive is A's late one, receives B's.
	za := zfs.NewClient(a.pool.Runner)
	_, local, _, err := retention.Read(ctx, za, a.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local)
	must.EqOp(t, archA, local[0].Name)
	got, err = a.keeper.Fetch(ctx, "state", tenant(3), local[0])
	must.NoError(t, err)
	must.NotEq(t, "", got, must.Sprint("B's data is newer than A's late archive"))
	must.NotEq(t, archA, got)
	must.EqOp(t, dataB, a.sum(t, got))
	// Retention on a ranks the received archive first: its lineage names A.
	_, local, _, err = retention.Read(ctx, za, a.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 2, local)
	must.EqOp(t, got, local[0].Name)
	must.Eq(t, record.Lineage{allocA.AllocID}, local[0].From, must.Sprint("the lineage came with the stream"))
	must.Eq(t, record.Lineage{allocB.AllocID, allocA.AllocID}, local[0].Lineage(), must.Sprint("what a restore of it records"))

	// On node b, B's own archive stays the newest: nothing is received.
	_, local, _, err = retention.Read(ctx, zfs.NewClient(b.pool.Runner), b.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local)
	must.EqOp(t, archB, local[0].Name)
	none, err := b.keeper.Fetch(ctx, "state", tenant(3), local[0])
	must.NoError(t, err)
	must.EqOp(t, "", none)
}
