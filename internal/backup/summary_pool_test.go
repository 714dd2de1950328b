package backup_test

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// TestBackup_SummaryAfterPasses: after a pass that sends an identity's
// first backup (whole) and one that sends its increment, the keeper's
// summary, kept from the listings the passes made, shows a chain of 2
// streams, the increment as the newest backup, and the same figures as a
// fresh read of backup_dir. A node that shares backup_dir and has sent
// nothing knows them after its first pass.
func TestBackup_SummaryAfterPasses(t *testing.T) {
	ctx, dir, a, b := twoNodes(t)
	_, ok := a.keeper.Summary()
	must.False(t, ok, must.Sprint("no pass yet"))

	arch := a.archive(t, tenant(1), 2)
	sent, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	full := sent[0]
	sum, ok := a.keeper.Summary()
	must.True(t, ok)
	must.SliceLen(t, 1, sum.Identities)
	must.SliceLen(t, 1, sum.Identities[0].Chain)

	a.pool.ZFS(t, "set", record.PropBackup+"="+record.BackupNone, arch)
	a.write(t, arch, 1)
	sent, _, err = a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	inc := sent[0]
	must.EqOp(t, full.GUID, inc.BaseGUID)

	sum, ok = a.keeper.Summary()
	must.True(t, ok)
	must.EqOp(t, dir, sum.Dir)
	must.SliceLen(t, 1, sum.Identities)
	got := sum.Identities[0]
	must.Eq(t, full.Identity, got.Identity)
	must.True(t, got.Complete())
	must.SliceLen(t, 2, got.Chain, must.Sprint("a full stream and its increment"))
	must.EqOp(t, inc.GUID, got.Chain[1].GUID)
	must.EqOp(t, inc.Size, got.NewestBytes, must.Sprint("the newest stream's size"))
	must.EqOp(t, full.Size+inc.Size, got.ChainBytes)
	must.True(t, inc.ReleasedAt.Equal(got.NewestReleasedAt))
	must.True(t, inc.Created.Equal(got.NewestCreated))
	must.EqOp(t, full.Size+inc.Size, sum.Bytes())

	// The same as a fresh read of backup_dir.
	ms, problems, err := backup.List(dir, nil)
	must.NoError(t, err)
	must.SliceEmpty(t, problems)
	fresh := backup.Summarize(ms)
	must.SliceLen(t, 1, fresh)
	must.EqOp(t, fresh[0].ChainBytes, got.ChainBytes)
	must.EqOp(t, len(fresh[0].Chain), len(got.Chain))
	must.EqOp(t, fresh[0].Bytes, got.Bytes)

	// Node b sent nothing; its first pass lists the whole of backup_dir.
	_, ok = b.keeper.Summary()
	must.False(t, ok)
	none, _, err := b.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, none)
	other, ok := b.keeper.Summary()
	must.True(t, ok)
	must.SliceLen(t, 1, other.Identities)
	must.SliceLen(t, 2, other.Identities[0].Chain)
	must.EqOp(t, inc.Size, other.Identities[0].NewestBytes)
}

// TestBackup_SummaryOfLiveBackups: live backups while the task runs are in
// the keeper's summary as they are sent (a live pass lists the identity it
// sent), marked live, each an increment on the chain; the release's
// backup, sent by the next pass, is the newest then, not live.
func TestBackup_SummaryOfLiveBackups(t *testing.T) {
	ctx, dir, a, _ := twoNodes(t)
	a.keeper.SetConfig(backup.Config{Dir: dir, Container: a.cfg.ArchiveDataset(), Classes: map[string]bool{"state": true},
		Live: map[string]time.Duration{"state": time.Millisecond}, ClassDatasets: map[string]string{"state": a.cfg.ClassDataset("state")}})
	// The first pass lists the whole of backup_dir: nothing yet.
	none, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, none)
	sum, ok := a.keeper.Summary()
	must.True(t, ok)
	must.SliceEmpty(t, sum.Identities)

	ds := a.inUse(t, tenant(1))
	a.write(t, ds, 2)
	var live []backup.Manifest
	for i := 0; i < 2; i++ {
		if i > 0 {
			a.write(t, ds, 1)
		}
		sent, _, err := a.keeper.LivePass(ctx)
		must.NoError(t, err)
		must.SliceLen(t, 1, sent)
		live = append(live, sent[0])
	}
	sum, _ = a.keeper.Summary()
	must.SliceLen(t, 1, sum.Identities)
	got := sum.Identities[0]
	must.True(t, got.NewestLive)
	must.True(t, live[1].ReleasedAt.Equal(got.NewestAt()), must.Sprint("a live backup's time is its snapshot's"))
	must.SliceLen(t, 2, got.Chain)
	must.EqOp(t, live[1].Size, got.NewestBytes)
	must.EqOp(t, live[0].Size+live[1].Size, got.ChainBytes)

	a.release(t, ds, tenant(1))
	sent, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	sum, _ = a.keeper.Summary()
	got = sum.Identities[0]
	must.False(t, got.NewestLive)
	must.SliceLen(t, 3, got.Chain)
	must.EqOp(t, sent[0].Size, got.NewestBytes)
	must.EqOp(t, live[0].Size+live[1].Size+sent[0].Size, sum.Bytes())
}
