package backup_test

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestBackup_EverySlotOfAnAllocationMoves: an allocation that held two
// devices of a class left two archives on node a, both sent to
// backup_dir. Its replacement on node b receives both, each with its own
// slot's data: the archive then holds every archive of the allocation,
// which a restore claims together.
func TestBackup_EverySlotOfAnAllocationMoves(t *testing.T) {
	ctx, _, a, b := twoNodes(t)
	o := tenant(1)
	sums := map[int]string{}
	at := time.Now().UTC()
	for slot := range 2 {
		ds := a.inUseAt(t, slot, o)
		a.write(t, ds, 1)
		sums[slot] = a.sum(t, ds)
		name := record.ArchivedName(a.cfg.ArchiveDataset(), "state", slot, o, at)
		a.pool.ZFS(t, "rename", ds, name)
		a.pool.ZFS(t, "set", record.PropState+"="+string(record.StateArchived), name)
	}
	sent, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 2, sent)

	got, err := b.keeper.Fetch(ctx, "state", tenant(2), retention.Archive{})
	must.NoError(t, err)
	must.NotEq(t, "", got)
	_, local, _, err := retention.Read(ctx, zfs.NewClient(b.pool.Runner), b.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 2, local, must.Sprint("both slots received"))
	for _, l := range local {
		must.EqOp(t, o.AllocID, l.AllocID)
		must.EqOp(t, sums[l.Slot], b.sum(t, l.Name), must.Sprintf("slot %d's data", l.Slot))
	}
}
