package backup_test

import (
	"context"
	"errors"
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
	ctx, _, a, b, c := threeLiveNodes(t)
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
	dsB := b.restoredFor(ctx, t, allocB, allocA)
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
	got, err := c.keeper.Fetch(ctx, "state", tenant(3), retention.Archive{})
	must.NoError(t, err)
	must.EqOp(t, dataB, c.sum(t, got))
	_, local, _, err := retention.Read(ctx, zfs.NewClient(c.pool.Runner), c.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local)
	must.EqOp(t, got, local[0].Name)
	must.Eq(t, record.Lineage{allocA.AllocID}, local[0].From, must.Sprint("the lineage came with the stream"))
	must.Eq(t, record.Lineage{allocB.AllocID, allocA.AllocID}, local[0].Lineage(), must.Sprint("what a restore of it records"))
}

// TestBackup_ALateReleaseOfAForkedIdentityIsRefused: the known path of a
// lost node that comes back. A runs on node a with live backups; a is
// lost. B restores A's live backup on node b, writes and is released. Then
// a comes back: A wrote after its last live backup, and its release's
// final stream is now the newest by time. The data forked: neither node
// restores either fork (a third node from backup_dir, node a from its own
// newer archive); each Fetch refuses with a *DivergedError naming both,
// and receives nothing; backup_dir's retention, even at keep = 1 after a
// new chain, deletes no stream of either. The operator then sets one fork
// aside (SetAside), and the restores take the other.
func TestBackup_ALateReleaseOfAForkedIdentityIsRefused(t *testing.T) {
	ctx, dir, a, b, c := threeLiveNodes(t)
	allocA, allocB := tenant(1), tenant(2)

	// A on node a: two live backups, the second an increment that weighs
	// more than the first (so that A's next stream starts a new chain);
	// then a is lost, A still writing.
	dsA := a.inUse(t, allocA)
	a.write(t, dsA, 1)
	_, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	a.write(t, dsA, 2)
	_, _, err = a.keeper.LivePass(ctx)
	must.NoError(t, err)
	// B restores it on node b, records where its data came from, writes
	// and is released.
	dsB := b.restoredFor(ctx, t, allocB, allocA)
	b.write(t, dsB, 1)
	dataB := b.sum(t, dsB)
	b.release(t, dsB, allocB)
	_, _, err = b.keeper.Pass(ctx)
	must.NoError(t, err)
	// Node a comes back: A's writes since its live backup, then its
	// release, sent last: as a new chain (its chain's increment weighs as
	// much as its full stream), after which retention at keep = 1 would
	// prune the older chain, which holds B's data, as superseded, but for
	// the fork.
	a.keeper.SetConfig(backup.Config{Dir: dir, Container: a.cfg.ArchiveDataset(), Classes: map[string]bool{"state": true},
		Rules: retention.Rules{Classes: map[string]retention.Policy{"state": {Keep: 1}}}, PruneGrace: time.Nanosecond})
	a.write(t, dsA, 1)
	dataA := a.sum(t, dsA)
	time.Sleep(1100 * time.Millisecond) // a release time of its own, to the second
	a.release(t, dsA, allocA)
	sent, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.EqOp(t, 0, sent[0].BaseGUID, must.Sprint("a new chain"))
	ms, _, err := backup.List(dir, nil)
	must.NoError(t, err)
	must.EqOp(t, allocA.AllocID, ms[0].AllocID, must.Sprint("A's late release is the newest by time"))
	var allocs []string
	for _, m := range ms {
		allocs = append(allocs, m.AllocID)
	}
	must.Eq(t, []string{allocA.AllocID, allocB.AllocID, allocA.AllocID, allocA.AllocID}, allocs, must.Sprint("no stream of either fork deleted"))

	// A third node: refused, nothing received.
	_, err = c.keeper.Fetch(ctx, "state", tenant(3), retention.Archive{})
	must.ErrorIs(t, err, backup.ErrDiverged)
	var d *backup.DivergedError
	must.True(t, errors.As(err, &d))
	must.EqOp(t, allocA.AllocID, d.Newest.AllocID)
	must.EqOp(t, allocB.AllocID, d.Other.AllocID)
	must.True(t, d.Successor)
	_, local, _, err := retention.Read(ctx, zfs.NewClient(c.pool.Runner), c.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceEmpty(t, local, must.Sprint("nothing received"))

	// Node a, its own archive of A the newest: refused as well.
	_, local, _, err = retention.Read(ctx, zfs.NewClient(a.pool.Runner), a.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local)
	_, err = a.keeper.Fetch(ctx, "state", tenant(3), local[0])
	must.ErrorIs(t, err, backup.ErrDiverged)
	must.True(t, errors.As(err, &d))
	must.StrContains(t, d.Newest.Where, local[0].Name)

	// The operator chooses (backups set-aside). B's fork set aside: the
	// third node restores A's data, and node a its own archive (Fetch
	// receives nothing: the local one is as new).
	_, err = backup.SetAside(dir, allocB.AllocID, false)
	must.NoError(t, err)
	got, err := c.keeper.Fetch(ctx, "state", tenant(3), retention.Archive{})
	must.NoError(t, err)
	must.EqOp(t, dataA, c.sum(t, got))
	got, err = a.keeper.Fetch(ctx, "state", tenant(3), local[0])
	must.NoError(t, err)
	must.EqOp(t, "", got)
	// A's set aside instead: a fourth node restores B's data; node a
	// refuses its own newer archive of A, and says how to move it away.
	_, err = backup.SetAside(dir, allocB.AllocID, true)
	must.NoError(t, err)
	_, err = backup.SetAside(dir, allocA.AllocID, false)
	must.NoError(t, err)
	e := newNode(t, dir)
	got, err = e.keeper.Fetch(ctx, "state", tenant(3), retention.Archive{})
	must.NoError(t, err)
	must.EqOp(t, dataB, e.sum(t, got))
	_, err = a.keeper.Fetch(ctx, "state", tenant(3), local[0])
	must.ErrorIs(t, err, backup.ErrSetAsideLocal)
	must.StrContains(t, err.Error(), "zfs rename "+local[0].Name)

}

// threeLiveNodes is twoNodes and a third node, each with live backups of
// class "state" every millisecond, and a LiveSettle of 200 ms for the
// test.
func threeLiveNodes(t *testing.T) (context.Context, string, *node, *node, *node) {
	t.Helper()
	ctx, dir, a, b := twoNodes(t)
	c := newNode(t, dir)
	saved := backup.LiveSettle
	backup.LiveSettle = 200 * time.Millisecond
	t.Cleanup(func() { backup.LiveSettle = saved })
	for _, n := range []*node{a, b, c} {
		n.live(dir, time.Millisecond)
	}
	return ctx, dir, a, b, c
}

// restoredFor receives the identity's newest backup on n for o and puts
// it in slot 0 as a restore leaves a slot: reserved for o, its data's
// lineage recorded (restored from from's data), and returns the slot's
// dataset.
func (n *node) restoredFor(ctx context.Context, t *testing.T, o, from record.Owner) string {
	t.Helper()
	got, err := n.keeper.Fetch(ctx, "state", o, retention.Archive{})
	must.NoError(t, err)
	must.NotEq(t, "", got)
	n.pool.ZFS(t, "create", "-p", n.cfg.ClassDataset("state"))
	ds := n.cfg.ClassDataset("state") + "/0"
	n.pool.ZFS(t, "rename", got, ds)
	for _, p := range [][2]string{
		{record.PropState, string(record.StateReserved)}, {record.PropOwner, o.Encode()},
		{record.PropBackup, record.BackupNone}, {record.PropDataFrom, record.Lineage(nil).Descend(from.AllocID).Encode()},
	} {
		n.pool.ZFS(t, "set", p[0]+"="+p[1], ds)
	}
	return ds
}
