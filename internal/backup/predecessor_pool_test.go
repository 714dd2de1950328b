package backup_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestBackup_ARestoreWaitsForItsPredecessorsFinalData: allocation 1 of
// an identity left its data in backup_dir from node a; allocation 2 ran
// there after it, with live backups (or none), and is being released.
// Its replacement, allocation 3 on node b, must start from allocation
// 2's data: while backup_dir holds none of it, or only a live backup (not
// its final data), FetchAfter receives nothing and says so
// (record.ErrNotArrived, with the command that sets it aside), where
// Fetch would take allocation 1's older data. Once allocation 2's release
// sent its final stream, FetchAfter receives it (not while a second slot
// it held has none); with it in the local archive, there is nothing to
// wait for.
func TestBackup_ARestoreWaitsForItsPredecessorsFinalData(t *testing.T) {
	ctx, dir, a, b := twoNodes(t)
	saved := backup.LiveSettle
	backup.LiveSettle = 200 * time.Millisecond
	t.Cleanup(func() { backup.LiveSettle = saved })
	first, second, third := tenant(1), tenant(2), tenant(3)
	old := a.archive(t, first, 1)
	oldSum := a.sum(t, old)
	_, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	ds := a.inUse(t, second)
	a.write(t, ds, 1)
	after := record.Awaited{Alloc: second.AllocID, Node: "node-a", Slots: []int{0}}
	container := func() string {
		t.Helper()
		return strings.TrimSpace(b.pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", b.cfg.ArchiveDataset()))
	}

	// Nothing of allocation 2 in backup_dir.
	_, err = b.keeper.FetchAfter(ctx, "state", third, retention.Archive{}, after)
	must.ErrorIs(t, err, record.ErrNotArrived)
	must.StrContains(t, err.Error(), "no backup of slot 0 of allocation "+second.AllocID)
	must.StrContains(t, err.Error(), "backups set-aside -alloc "+second.AllocID+" -identity ")
	must.EqOp(t, b.cfg.ArchiveDataset(), container(), must.Sprint("nothing received"))
	// What a restore that does not know its predecessor takes: older data.
	got, err := b.keeper.Fetch(ctx, "state", third, retention.Archive{})
	must.NoError(t, err)
	must.EqOp(t, oldSum, b.sum(t, got), must.Sprint("allocation 1's data"))
	b.pool.ZFS(t, "destroy", "-r", got)

	// A live backup of allocation 2 is not its final data.
	a.live(dir, time.Millisecond)
	sent, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.True(t, sent[0].Live)
	_, err = b.keeper.FetchAfter(ctx, "state", third, retention.Archive{}, after)
	must.ErrorIs(t, err, record.ErrNotArrived)
	must.StrContains(t, err.Error(), "only a live backup")
	must.EqOp(t, b.cfg.ArchiveDataset(), container(), must.Sprint("nothing received"))

	// Released: its final stream arrives, and the restore takes it.
	a.write(t, ds, 1)
	final := a.sum(t, ds)
	a.release(t, ds, second)
	sent, _, err = a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.False(t, sent[0].Live)
	// Had it held two devices, the second's final would be awaited too.
	_, err = b.keeper.FetchAfter(ctx, "state", third, retention.Archive{}, record.Awaited{Alloc: second.AllocID, Slots: []int{0, 1}})
	must.ErrorIs(t, err, record.ErrNotArrived)
	must.StrContains(t, err.Error(), "no backup of slot 1")
	must.EqOp(t, b.cfg.ArchiveDataset(), container(), must.Sprint("nothing received"))
	got, err = b.keeper.FetchAfter(ctx, "state", third, retention.Archive{}, after)
	must.NoError(t, err)
	must.EqOp(t, final, b.sum(t, got), must.Sprint("allocation 2's final data"))

	// In the local archive: nothing to wait for, nothing newer to receive.
	_, local, _, err := retention.Read(ctx, zfs.NewClient(b.pool.Runner), b.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local)
	must.EqOp(t, second.AllocID, local[0].AllocID)
	again, err := b.keeper.FetchAfter(ctx, "state", third, local[0], after)
	must.NoError(t, err)
	must.EqOp(t, "", again)
}
