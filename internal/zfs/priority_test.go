package zfs_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
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

			second := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := r.ZFSCmd(ctxFor(tc.thenFG), "get", "-H", "-o", "value", "used", ds)
				second <- err
			}()
			if tc.secondWait {
				select {
				case err := <-second:
					t.Fatalf("the background command ran while the foreground one was paused (err %v)", err)
				case <-time.After(time.Second):
				}
				must.False(t, ranGet(w, ds), must.Sprint("get started before the foreground set ended"))
				w.Resume(tc.paused)
				must.NoError(t, <-first)
				must.NoError(t, <-second)
				return
			}
			select {
			case err := <-second:
				must.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("the second command waited for the paused first one")
			}
			must.GreaterEq(t, tc.atLeast, time.Since(start))
			must.True(t, ranGet(w, ds))
			w.Resume(tc.paused)
			must.NoError(t, <-first)
		})
	}
}

// ranGet reports whether the wrapper recorded a `zfs get` of ds.
func ranGet(w *zfstest.Wrapper, ds string) bool {
	return slices.ContainsFunc(w.Calls(), func(c zfstest.Call) bool {
		return c.Cmd == "zfs" && len(c.Args) > 0 && c.Args[0] == "get" && slices.Contains(c.Args, ds)
	})
}
