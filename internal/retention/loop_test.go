package retention_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// passLog records when Loop ran its passes.
type passLog struct {
	mu sync.Mutex
	at []time.Time
}

func (p *passLog) pass(context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = append(p.at, time.Now())
	return false, nil
}

func (p *passLog) times() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at...)
}

// runLoop runs retention.Loop with a long period until the test ends.
func runLoop(t *testing.T, kick chan struct{}) *passLog {
	t.Helper()
	log := &passLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		retention.Loop(ctx, time.Hour, retention.KickGap, kick, log.pass)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return log
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(cond), wait.Timeout(10*time.Second), wait.Gap(20*time.Millisecond)))
}

// kickEvery sends n kicks, one each gap, as every release of a churn does,
// and returns when it sent the last one (taken just before the send: the
// pass that serves it may begin before kickEvery returns).
func kickEvery(kick chan struct{}, n int, gap time.Duration) (last time.Time) {
	for i := range n {
		if i > 0 {
			time.Sleep(gap)
		}
		last = time.Now()
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	return last
}

func TestLoop_KicksWithinTheGapShareOnePass(t *testing.T) {
	cases := []struct {
		name  string
		kicks int
		gap   time.Duration
		// passes after the first (the one at start): at least, at most.
		min, max int
	}{
		// A release every 100 ms for a second: one pass serves them all.
		{name: "churn", kicks: 10, gap: 100 * time.Millisecond, min: 1, max: 1},
		// One release long after the start: served at once.
		{name: "lone kick", kicks: 1, gap: 0, min: 1, max: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kick := make(chan struct{}, 1)
			log := runLoop(t, kick)
			waitFor(t, func() bool { return len(log.times()) == 1 })
			if tc.name == "lone kick" {
				time.Sleep(retention.KickGap)
			}
			sent := time.Now()
			last := kickEvery(kick, tc.kicks, tc.gap)
			// Every kick is served: a pass begins after the last one.
			waitFor(t, func() bool {
				at := log.times()
				return at[len(at)-1].After(last)
			})
			time.Sleep(retention.KickGap + 200*time.Millisecond) // nothing more comes
			at := log.times()
			more := len(at) - 1
			must.Between(t, tc.min, more, tc.max, must.Sprintf("passes after the first: %v", at))
			if tc.name == "lone kick" {
				must.Less(t, 200*time.Millisecond, at[1].Sub(sent), must.Sprint("a kick long after the last pass is served at once"))
			} else {
				must.GreaterEq(t, retention.KickGap, at[1].Sub(at[0]), must.Sprint("no pass sooner than KickGap after the one before"))
			}
		})
	}
}
