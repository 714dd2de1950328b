package backup_test

import (
	"context"
	"regexp"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Retention prunes no archive of a class with backup_dir until it is sent.
// A prune held back for that comes once the keeper has sent the archive
// (OnSent kicks retention, and that pass is not put off as an idle one),
// not at retention's next period: with no release after it, nothing else
// asks for a pass (CI, 2026-12-07: the periodic scenario counted a
// parent's archive over keep).
func TestBackup_APruneHeldForTheBackupComesWhenItIsSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	n := newNode(t, t.TempDir())
	older := n.archive(t, tenant(1), 1)
	// The archives' release times are in seconds, and on a tie the
	// archive ranks by name: the second must be released later to be the
	// newer, which keep = 1 keeps.
	time.Sleep(1100 * time.Millisecond)
	newer := n.archive(t, tenant(2), 1)

	pruner := retention.New(zfs.NewClient(n.pool.Runner), hclog.NewNullLogger())
	pruner.SetConfig(retention.Config{Container: n.cfg.ArchiveDataset(),
		Rules: retention.Rules{Classes: map[string]retention.Policy{"state": {Keep: 1, Backup: true}}}})
	passes := make(chan []retention.Archive, 64)
	pruner.OnPass(func(kept []retention.Archive) {
		select {
		case passes <- kept:
		default:
		}
	})
	n.keeper.OnSent(pruner.Kick)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	// Retention's pass at start, before anything is sent: both kept.
	wg.Go(func() { pruner.Run(runCtx, time.Hour) })
	select {
	case kept := <-passes:
		must.SliceLen(t, 2, kept, must.Sprint("nothing is pruned before it is sent"))
	case <-ctx.Done():
		t.Fatal("no retention pass at start")
	}
	// The keeper sends both; the older goes within a few KickGaps, far
	// sooner than IdleKickGap or the period.
	sentAt := time.Now()
	wg.Go(func() { n.keeper.Run(runCtx, time.Hour) })
	deadline := time.Now().Add(retention.IdleKickGap / 2)
	for {
		if _, err := n.pool.TryProp(older, "name"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there %s after the keeper began: the prune waits for another pass", older, time.Since(sentAt).Round(time.Second))
		}
		time.Sleep(200 * time.Millisecond)
	}
	must.Eq(t, newer, n.pool.Prop(t, newer, "name"))
	must.RegexMatch(t, regexp.MustCompile(`^[0-9]+$`), n.pool.Prop(t, newer, retention.PropBackup), must.Sprint("the newer is sent (its snapshot's GUID), and kept"))
}
