package backup_test

import (
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// TestBackup_EverySlotOfAnAllocationMoves: an allocation that held two
// devices of a class left two archives on node a, both sent to
// backup_dir. Its replacement on node b receives both, each with its own
// slot's data: the archive then holds every archive of the allocation,
// which a restore claims together. A restore cut short after the first
// slot (the second's stream does not verify) receives the rest next time,
// its newest local archive being the first slot's.
func TestBackup_EverySlotOfAnAllocationMoves(t *testing.T) {
	ctx, dir, a, b := twoNodes(t)
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

	// A restore cut short: the slot received second (the newest
	// manifest's slot goes first) has a stream that does not verify; the
	// first arrives alone.
	ms, _, err := backup.List(dir, nil)
	must.NoError(t, err)
	var stream1 string
	for _, m := range sent {
		if m.Slot != ms[0].Slot {
			stream1 = m.StreamPath()
		}
	}
	good, err := os.ReadFile(stream1)
	must.NoError(t, err)
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 1
	must.NoError(t, os.WriteFile(stream1, bad, 0o600))
	_, err = b.keeper.Fetch(ctx, "state", tenant(2), retention.Archive{})
	must.Error(t, err)
	_, local, _, err := retention.Read(ctx, zfs.NewClient(b.pool.Runner), b.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 1, local, must.Sprint("the first slot received before the second failed"))

	// The next restore, its newest local archive the first slot's: the
	// second arrives too, the first is not received again.
	must.NoError(t, os.WriteFile(stream1, good, 0o600))
	got, err := b.keeper.Fetch(ctx, "state", tenant(2), local[0])
	must.NoError(t, err)
	must.NotEq(t, "", got)
	_, local, _, err = retention.Read(ctx, zfs.NewClient(b.pool.Runner), b.cfg.ArchiveDataset())
	must.NoError(t, err)
	must.SliceLen(t, 2, local, must.Sprint("both slots received"))
	for _, l := range local {
		must.EqOp(t, o.AllocID, l.AllocID)
		must.EqOp(t, sums[l.Slot], b.sum(t, l.Name), must.Sprintf("slot %d's data", l.Slot))
	}
}
