// Package loop drives the plugin's periodic parts: the release passes and
// the rounds beside them (slots), retention, backups, the node metadata,
// the shared classes' reads, the allocation watch, and the fingerprint and
// stats streams. A part is what one pass does; Run calls it when its timer
// fires or when it is kicked, on the caller's goroutine, until ctx is done.
//
// The timer is the pass's own: First sets it for the first run, and each
// pass sets it again by returning After(d), or leaves it as it is. So a
// part whose every run is alike (retention) returns After(period) from
// each, and a kick postpones its next periodic run; a part whose timer runs
// do more than its kicked ones (the fingerprint's sync with ZFS, the
// release pass that reads the allocations anew) returns After only from a
// run the timer started (Wake.Timer), so that no churn of kicks ever holds
// its periodic run back.
package loop

import (
	"context"
	"time"

	hclog "github.com/hashicorp/go-hclog"
)

// Config says when a part runs. The zero Config runs a part never: give it
// First, a Kick, or both.
type Config struct {
	// Name names the part in the driver's logs.
	Name string
	// Log receives the driver's logs (each run at Trace, a Stop with an
	// error at Debug); nil for none. The part logs its own errors.
	Log hclog.Logger
	// First sets the timer for the first run: After(0) runs the part at
	// once, After(d) d after Run began. The zero Next sets no timer: the
	// part runs at kicks only.
	First Next
	// Kick, when not nil, asks for a run: each value received starts one at
	// once (or at Gap). Kicks that come before a run begins are all served
	// by it; those that come while it works, by one run after it. Send on
	// it with Kick, never a blocking send.
	Kick <-chan struct{}
	// Gap, when > 0, holds a run that a kick asks for until Gap after the
	// last run began; the kicks that come meanwhile are served by it. A
	// timer run is never held.
	Gap time.Duration
	// Timeout, when > 0, bounds each run: the ctx a pass receives is done
	// Timeout after the run began.
	Timeout time.Duration
}

// Wake says what a run serves; both may hold.
type Wake struct {
	// Timer: the timer fired (First, or the After a pass returned).
	Timer bool
	// Kick: a kick came after the last run began (or at all, for the
	// first run).
	Kick bool
}

// Next is what a pass asks of the driver when it is done. The zero Next
// leaves the timer as it is: set and not fired yet, it still fires when
// due; fired, none is set until a pass returns After.
type Next struct {
	after time.Duration
	timed bool // after is set
	stop  bool
	err   error
}

// After sets the timer: the next run comes d after this one ended (0: at
// once), or sooner at a kick. It replaces a timer that has not fired.
func After(d time.Duration) Next { return Next{after: d, timed: true} }

// Stop ends the part: Run returns err (nil for none) without another run.
func Stop(err error) Next { return Next{stop: true, err: err} }

// Pass is what one run of a part does. ctx is Run's (bounded by
// Config.Timeout when set); w says what the run serves.
type Pass func(ctx context.Context, w Wake) Next

// Run calls pass as cfg says, one run at a time on the caller's goroutine
// (it starts none), until ctx is done or a pass returns Stop. It returns
// nil when ctx is done, and the error given to Stop otherwise: a part
// whose passes never Stop with an error has no result to look at. Once it
// has seen ctx done it begins no run; a run under way is not interrupted,
// but its ctx is done. Run never sends on a channel, so nothing blocks on
// it after it returns; its timer is stopped when it returns.
func Run(ctx context.Context, cfg Config, pass Pass) error {
	log := cfg.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	var (
		due    time.Time // when the timer fires, if timed
		timed  bool
		kicked bool      // a kick waits for a run
		last   time.Time // when the last run began; zero before the first
	)
	setTimer := func(n Next) {
		if n.timed {
			due, timed = time.Now().Add(n.after), true
		}
	}
	setTimer(cfg.First)
	for {
		if ctx.Err() != nil {
			log.Trace("part stopped", "part", cfg.Name)
			return nil
		}
		if !kicked { // a kick that is already there is this run's
			select {
			case <-cfg.Kick: // a nil Kick is never ready
				kicked = true
			default:
			}
		}
		// The run begins at the earlier of the timer and a kick (held
		// until Gap after the last run began); with neither, Run waits.
		now := time.Now()
		at, waiting := due, timed
		if kicked {
			if k := last.Add(cfg.Gap); !waiting || k.Before(at) {
				at, waiting = k, true
			}
		}
		if !waiting || at.After(now) {
			var fire <-chan time.Time
			if waiting {
				timer.Reset(at.Sub(now))
				fire = timer.C
			}
			select {
			case <-ctx.Done():
			case <-cfg.Kick:
				kicked = true // more kicks while one waits: the same run
			case <-fire:
			}
			timer.Stop()
			continue // ctx checked, the time taken anew
		}

		w := Wake{Timer: timed && !now.Before(due), Kick: kicked}
		if w.Timer {
			timed = false
		}
		kicked, last = false, now
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.Timeout > 0 {
			rctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		}
		next := pass(rctx, w)
		cancel()
		if log.IsTrace() {
			log.Trace("part ran", "part", cfg.Name, "timer", w.Timer, "kick", w.Kick, "took", time.Since(now))
		}
		if next.stop {
			if next.err != nil {
				log.Debug("part stopped by its pass", "part", cfg.Name, "error", next.err)
			}
			return next.err
		}
		setTimer(next)
	}
}

// Kick asks for a run of the part whose Config.Kick is ch. It never
// blocks: ch has room for one value (make(chan struct{}, 1)), and one
// waiting is enough, so a kick that finds it full is served by the run
// that value asks for. After the part's Run has returned, it still never
// blocks.
func Kick(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
