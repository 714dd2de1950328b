package backup_test

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
)

// TestBackup_ALivePassYieldsToARelease: a live pass with two datasets due
// is in its first send (paused by a zfs wrapper) when a release's archive
// pass starts. The archive pass goes next, not after the second live
// send: a restore elsewhere waits for that release's final stream
// (LiveSettle), and a batch of live sends must not make it miss it. The
// live pass says the rest is due at once, and the next one sends it.
func TestBackup_ALivePassYieldsToARelease(t *testing.T) {
	ctx, w, a := twoInUse(t)
	arch := a.archive(t, tenant(2), 1)

	type passResult struct {
		sent []backup.Manifest
		next time.Duration
		err  error
	}
	w.Pause("send")
	liveDone := make(chan passResult, 1)
	go func() {
		sent, next, err := a.keeper.LivePass(ctx)
		liveDone <- passResult{sent, next, err}
	}()
	w.WaitPaused(t, "send", time.Minute)
	passDone := make(chan passResult, 1)
	go func() {
		sent, _, err := a.keeper.Pass(ctx)
		passDone <- passResult{sent: sent, err: err}
	}()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return a.keeper.ReleasesWaiting() == 1 }),
		wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)))
	w.Resume("send")

	var live passResult
	select {
	case live = <-liveDone:
	case <-ctx.Done():
		t.Fatal("the live pass did not end")
	}
	must.NoError(t, live.err)
	must.SliceLen(t, 1, live.sent, must.Sprint("one live send, then the release's"))
	must.EqOp(t, time.Duration(0), live.next, must.Sprint("the other dataset is due at once"))
	var released passResult
	select {
	case released = <-passDone:
	case <-ctx.Done():
		t.Fatal("the archive pass did not end")
	}
	must.NoError(t, released.err)
	must.SliceLen(t, 1, released.sent)
	must.EqOp(t, arch, released.sent[0].Dataset)

	rest, _, err := a.keeper.LivePass(context.WithoutCancel(ctx))
	must.NoError(t, err)
	must.SliceLen(t, 1, rest)
	must.NotEq(t, live.sent[0].Dataset, rest[0].Dataset, must.Sprint("the next live pass sends the other one"))
}
