package backup_test

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
)

// TestBackup_ASlotKeepsTheSnapshotBackupDirHolds: a dataset in use has the
// keeper's base of its next live increment (in backup_dir) and a newer
// snapshot of the keeper's whose send never finished (not in backup_dir).
// The pass's sweep keeps the base, not the newest, so the next live backup
// is still an increment of it rather than a full stream.
func TestBackup_ASlotKeepsTheSnapshotBackupDirHolds(t *testing.T) {
	ctx, dir, a, _ := twoNodes(t)
	a.live(dir, time.Millisecond)
	ds := a.inUse(t, tenant(1))
	a.write(t, ds, 1)
	sent, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	base := ds + "@" + sent[0].Snapshot
	unsent := ds + "@" + backup.LiveSnapshotPrefix + "29991231T000000.000000000Z"
	a.pool.ZFS(t, "snapshot", unsent)
	must.Eq(t, []string{base, unsent}, snapshotsOf(t, a.pool, ds))

	_, _, err = a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.Eq(t, []string{base}, snapshotsOf(t, a.pool, ds), must.Sprint("the base backup_dir holds stays; the unsent one goes"))

	a.write(t, ds, 1)
	next, _, err := a.keeper.LivePass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, next)
	must.EqOp(t, sent[0].GUID, next[0].BaseGUID, must.Sprint("an increment of the base, not a full stream"))
}
