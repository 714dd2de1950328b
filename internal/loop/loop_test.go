package loop_test

// The driver's tests run in a synctest bubble: time is the bubble's fake
// clock, which moves only when every goroutine in it is blocked, so the
// times asserted are exact however loaded the machine is, and
// synctest.Wait says when Run has nothing left to do. synctest.Test also
// fails a test whose goroutines do not all end: a Run that does not return
// at ctx's end, or a send that blocks after it, is a failure, not a leak.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
)

// ran is one run as the pass saw it: when it began (from Run's start),
// what it served, and how long its ctx had (0 for no deadline).
type ran struct {
	at       time.Duration
	w        loop.Wake
	deadline time.Duration
}

// recorder runs the driver on its own goroutine and records its runs.
type recorder struct {
	start time.Time
	kick  chan struct{}
	done  chan struct{}
	err   error // Run's result, once done is closed

	mu   sync.Mutex // guards runs
	runs []ran
}

// start runs loop.Run with cfg (its Kick the recorder's) until ctx is
// done. Each pass is recorded, then calls pass with its index (from 0).
func start(ctx context.Context, cfg loop.Config, pass func(ctx context.Context, i int, w loop.Wake) loop.Next) *recorder {
	r := &recorder{start: time.Now(), kick: make(chan struct{}, 1), done: make(chan struct{})}
	cfg.Kick = r.kick
	go func() {
		defer close(r.done)
		r.err = loop.Run(ctx, cfg, func(ctx context.Context, w loop.Wake) loop.Next {
			now := time.Now()
			var left time.Duration
			if d, ok := ctx.Deadline(); ok {
				left = d.Sub(now)
			}
			r.mu.Lock()
			i := len(r.runs)
			r.runs = append(r.runs, ran{at: now.Sub(r.start), w: w, deadline: left})
			r.mu.Unlock()
			return pass(ctx, i, w)
		})
	}()
	return r
}

func (r *recorder) ran() []ran {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ran(nil), r.runs...)
}

var (
	timer  = loop.Wake{Timer: true}
	kicked = loop.Wake{Kick: true}
	both   = loop.Wake{Timer: true, Kick: true}
)

func TestRun_When(t *testing.T) {
	s := time.Second
	cases := []struct {
		name string
		cfg  loop.Config
		// next is what the i-th pass returns.
		next func(i int, w loop.Wake) loop.Next
		// script runs on the test's goroutine from Run's start.
		script func(kick func())
		want   []ran
	}{{
		name:   "at once, then each period after the run",
		cfg:    loop.Config{First: loop.After(0)},
		next:   func(int, loop.Wake) loop.Next { return loop.After(10 * s) },
		script: func(func()) { time.Sleep(35 * s) },
		want:   []ran{{at: 0, w: timer}, {at: 10 * s, w: timer}, {at: 20 * s, w: timer}, {at: 30 * s, w: timer}},
	}, {
		name:   "first run after a period",
		cfg:    loop.Config{First: loop.After(10 * s)},
		next:   func(int, loop.Wake) loop.Next { return loop.After(10 * s) },
		script: func(func()) { time.Sleep(25 * s) },
		want:   []ran{{at: 10 * s, w: timer}, {at: 20 * s, w: timer}},
	}, {
		name: "no timer: kicks only, each at once",
		next: func(int, loop.Wake) loop.Next { return loop.Next{} },
		script: func(kick func()) {
			time.Sleep(time.Hour)
			kick()
			time.Sleep(time.Minute)
			kick()
			time.Sleep(time.Hour)
		},
		want: []ran{{at: time.Hour, w: kicked}, {at: time.Hour + time.Minute, w: kicked}},
	}, {
		// The fingerprint's and the release passes' way: a churn of
		// kicks never holds the periodic run back.
		name: "a kicked run that returns the zero Next leaves the timer",
		cfg:  loop.Config{First: loop.After(10 * s)},
		next: func(_ int, w loop.Wake) loop.Next {
			if w.Timer {
				return loop.After(10 * s)
			}
			return loop.Next{}
		},
		script: func(kick func()) {
			time.Sleep(3 * s)
			kick()
			time.Sleep(22 * s)
		},
		want: []ran{{at: 3 * s, w: kicked}, {at: 10 * s, w: timer}, {at: 20 * s, w: timer}},
	}, {
		// Retention's way: every run is alike, a kicked one stands for
		// the periodic one.
		name: "a kicked run that returns After puts the timer off",
		cfg:  loop.Config{First: loop.After(0)},
		next: func(int, loop.Wake) loop.Next { return loop.After(10 * s) },
		script: func(kick func()) {
			time.Sleep(3 * s)
			kick()
			time.Sleep(15 * s)
		},
		want: []ran{{at: 0, w: timer}, {at: 3 * s, w: kicked}, {at: 13 * s, w: timer}},
	}, {
		name: "After(0): again at once while more is due",
		cfg:  loop.Config{First: loop.After(0)},
		next: func(i int, _ loop.Wake) loop.Next {
			if i < 3 {
				return loop.After(0)
			}
			return loop.After(time.Hour)
		},
		script: func(func()) { time.Sleep(time.Minute) },
		want:   []ran{{at: 0, w: timer}, {at: 0, w: timer}, {at: 0, w: timer}, {at: 0, w: timer}},
	}, {
		// A release every 100 ms for a second: one run at the gap's end
		// serves them all; a lone kick long after is served at once.
		name: "kicks within the gap share one run",
		cfg:  loop.Config{First: loop.After(0), Gap: 2 * s},
		next: func(int, loop.Wake) loop.Next { return loop.After(time.Hour) },
		script: func(kick func()) {
			for range 10 {
				time.Sleep(100 * time.Millisecond)
				kick()
			}
			time.Sleep(9 * s) // to 10 s
			kick()
			time.Sleep(5 * s)
		},
		want: []ran{{at: 0, w: timer}, {at: 2 * s, w: kicked}, {at: 10 * s, w: kicked}},
	}, {
		name: "the gap never holds a timer run, which serves the kick",
		cfg:  loop.Config{First: loop.After(0), Gap: 2 * s},
		next: func(i int, _ loop.Wake) loop.Next {
			if i == 0 {
				return loop.After(s)
			}
			return loop.After(time.Hour)
		},
		script: func(kick func()) {
			time.Sleep(500 * time.Millisecond)
			kick()
			time.Sleep(5 * s)
		},
		want: []ran{{at: 0, w: timer}, {at: s, w: both}},
	}, {
		name:   "Timeout bounds each run's ctx",
		cfg:    loop.Config{First: loop.After(0), Timeout: 5 * s},
		next:   func(int, loop.Wake) loop.Next { return loop.After(10 * s) },
		script: func(func()) { time.Sleep(15 * s) },
		want:   []ran{{at: 0, w: timer, deadline: 5 * s}, {at: 10 * s, w: timer, deadline: 5 * s}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				r := start(ctx, tc.cfg, func(_ context.Context, i int, w loop.Wake) loop.Next { return tc.next(i, w) })
				tc.script(func() { loop.Kick(r.kick) })
				synctest.Wait()
				got := r.ran()
				cancel()
				<-r.done
				must.NoError(t, r.err)
				must.Eq(t, tc.want, got)
			})
		})
	}
}

func TestRun_KicksWhileARunWorksMakeOneMoreRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		began, hold := make(chan struct{}), make(chan struct{})
		r := start(ctx, loop.Config{}, func(_ context.Context, i int, _ loop.Wake) loop.Next {
			if i == 0 {
				close(began)
				<-hold
			}
			return loop.Next{}
		})
		loop.Kick(r.kick)
		<-began
		for range 5 {
			loop.Kick(r.kick) // never blocks, though nothing reads
		}
		close(hold)
		synctest.Wait() // Run has nothing left to do
		must.Eq(t, []ran{{w: kicked}, {w: kicked}}, r.ran())
	})
}

func TestRun_Stops(t *testing.T) {
	errStream := errors.New("stream ended")
	cases := []struct {
		name string
		cfg  loop.Config
		// pass is what every run does; cancel cancels Run's ctx.
		pass func(ctx context.Context, cancel func()) loop.Next
		// cancelAt cancels Run's ctx then (0: never).
		cancelAt time.Duration
		wantRuns int
		wantErr  error
	}{{
		name:     "ctx done while it waits",
		cfg:      loop.Config{First: loop.After(time.Hour)},
		pass:     func(context.Context, func()) loop.Next { return loop.Next{} },
		cancelAt: time.Minute,
		wantRuns: 0,
	}, {
		// The run under way ends, and none begins after it, though it
		// asked for one at once.
		name: "ctx done during a run",
		cfg:  loop.Config{First: loop.After(0)},
		pass: func(ctx context.Context, cancel func()) loop.Next {
			cancel()
			<-ctx.Done()
			return loop.After(0)
		},
		wantRuns: 1,
	}, {
		name:     "Stop with an error",
		cfg:      loop.Config{First: loop.After(0)},
		pass:     func(context.Context, func()) loop.Next { return loop.Stop(errStream) },
		wantRuns: 1,
		wantErr:  errStream,
	}, {
		name:     "Stop with none",
		cfg:      loop.Config{First: loop.After(0)},
		pass:     func(context.Context, func()) loop.Next { return loop.Stop(nil) },
		wantRuns: 1,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				r := start(ctx, tc.cfg, func(ctx context.Context, _ int, _ loop.Wake) loop.Next { return tc.pass(ctx, cancel) })
				if tc.cancelAt > 0 {
					time.Sleep(tc.cancelAt)
					cancel()
				}
				<-r.done
				must.ErrorIs(t, r.err, tc.wantErr)
				must.Eq(t, tc.wantRuns, len(r.ran()))
				// Nothing reads the kicks any more: they still never block,
				// and no run follows them.
				loop.Kick(r.kick)
				loop.Kick(r.kick)
				synctest.Wait()
				must.Eq(t, tc.wantRuns, len(r.ran()))
			})
		})
	}
}
