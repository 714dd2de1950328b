package zfs_test

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// A command run with a Foreground context goes first: while it runs, the
// runner's other commands wait before they start (up to MaxYield), and a
// foreground command never waits for a background one. The real zfs runs
// behind a wrapper that pauses the first command of each case.
func TestRunner_ForegroundGoesFirst(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	ds := pool.Dataset("prio")
	pool.ZFS(t, "create", ds)

	cases := []struct {
		name       string
		paused     string // the subcommand paused: it runs first
		pausedFG   bool   // ... in the foreground
		maxYield   time.Duration
		thenFG     bool          // the second command runs in the foreground
		secondWait bool          // the second one waits for the first to be resumed
		atLeast    time.Duration // ... or, when it does not, how long it still waited
	}{
		{name: "background waits for the foreground", paused: "set", pausedFG: true, maxYield: time.Minute, secondWait: true},
		{name: "background waits MaxYield at most", paused: "set", pausedFG: true, maxYield: 300 * time.Millisecond, atLeast: 300 * time.Millisecond},
		{name: "foreground never waits for background", paused: "set", maxYield: time.Minute, thenFG: true},
		{name: "background never waits for background", paused: "set", maxYield: time.Minute},
		{name: "negative MaxYield: no wait", paused: "set", pausedFG: true, maxYield: -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &zfs.Runner{MaxYield: tc.maxYield}
			ctxFor := func(fg bool) context.Context {
				if fg {
					return zfs.Foreground(context.Background())
				}
				return context.Background()
			}
			w.Pause(tc.paused)
			t.Cleanup(func() { w.Resume(tc.paused) })
			first := make(chan error, 1)
			go func() {
				_, err := r.ZFSCmd(ctxFor(tc.pausedFG), "set", "nomad-device-zfs:prio=1", ds)
				first <- err
			}()
			w.WaitPaused(t, tc.paused, 30*time.Second)

			args := []string{"get", "-H", "-o", "value", "used", ds}
			second := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := r.ZFSCmd(ctxFor(tc.thenFG), args...)
				second <- err
			}()
			if tc.secondWait {
				mustWaitForResume(t, w, tc.paused, first, second, args)
				return
			}
			mustGoOn(t, tc.paused, second, args)
			must.GreaterEq(t, tc.atLeast, time.Since(start))
			must.True(t, ran(w, args))
			w.Resume(tc.paused)
			must.NoError(t, <-first)
		})
	}
}
