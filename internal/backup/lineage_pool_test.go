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

// TestBackup_TheDatasLineageTravelsWithIt: A runs on node a with live
// backups; a is lost. Its replacement B restores A's last live backup on
// node b, which records that its data came from A (as restore's into does),
// writes, and is released. B's live and final streams say where their data
// came from (data_from), and a third node that restores B's data receives
// that record with the stream: what a restore of it records names B, then
// A.
func TestBackup_TheDatasLineageTravelsWithIt(t *testing.T) {
	ctx, dir, a, b := twoNodes(t)
	c := newNode(t, dir)
	saved := backup.LiveSettle
	backup.LiveSettle = 200 * time.Millisecond
	t.Cleanup(func() { backup.LiveSettle = saved })
	for _, n := range []*node{a, b, c} {
		n.live(dir, time.Millisecond)
	}
	allocA, allocB := tenant(1), tenant(2)

	// A on node a: a live backup, then a is lost.
	dsA := a.inUse(t, allocA)
	a.write(t, dsA, 2)
	sent, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.SliceEmpty(t, sent[0].From, must.Sprint("data never restored has no lineage"))

	// B restores it on node b, as restore's into leaves a slot: reserved for
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
	b.release(t, dsB, allocB)
	sent, _, err = b.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.Eq(t, record.Lineage{allocA.AllocID}, sent[0].From, must.Sprint("and so does its release"))

	// A third node restores B's data, the lineage with it.
	got, err = c.keeper.Fetch(ctx, "state", tenant(3), retention.Archive{})
	must.NoError(t, err)
	must.EqOp(t, dataB, c.sum(t, got))
	_, local, _, err := retention.Read(ctx, zfs.NewClient(c.pool.Runner), c.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local)
	must.EqOp(t, got, local[0].Name)
	must.Eq(t, record.Lineage{allocA.AllocID}, local[0].From, must.Sprint("the lineage came with the stream"))
	must.Eq(t, record.Lineage{allocB.AllocID, allocA.AllocID}, local[0].Lineage(), must.Sprint("what a restore of it records"))
}
