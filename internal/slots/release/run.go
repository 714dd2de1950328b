package release

// A release run: the zfs work of one slot's release, carried out in the
// background, one run per slot at a time, that a Reserve of the slot can
// hurry or wait for.

import (
	"context"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"
)

// runTimeout bounds one release run.
const runTimeout = 5 * time.Minute

// Run is work on one slot carried out by a goroutine of its own: a
// release, or the making of its spare. One runs per slot at a time (Runs).
type Run struct {
	done chan struct{} // closed when the run ends; err is set before
	err  error
	// release: the run releases a dataset (not only makes a spare).
	release bool
	// hurried is closed once a Reserve waits for the run (Hurry): it
	// yields to tasks' starts no more.
	hurried   chan struct{}
	hurryOnce sync.Once
	// after is the run this one waits for before it begins (a spare
	// being made, which a release goes after); nil for none.
	after *Run
}

// newRun returns a run not started, to go after prev (nil for none).
func newRun(release bool, prev *Run) *Run {
	return &Run{done: make(chan struct{}), release: release, hurried: make(chan struct{}), after: prev}
}

// Done is closed when the run ends.
func (r *Run) Done() <-chan struct{} { return r.done }

// Err is what the run ended with; read it once Done is closed.
func (r *Run) Err() error { return r.err }

// Hurried is closed once a Reserve waits for the run.
func (r *Run) Hurried() <-chan struct{} { return r.hurried }

// Hurry has r, and the run it goes after, stop yielding to tasks' starts:
// a Reserve waits for r. Safe to call more than once.
func (r *Run) Hurry() {
	r.hurryOnce.Do(func() { close(r.hurried) })
	if r.after != nil {
		r.after.Hurry()
	}
}

// Runs are the runs being carried out, by slot ID, one per slot. Its lock
// is taken last: the manager's may be held (as when a Sync checks that no
// run works on a slot), and it is held across no other lock.
type Runs struct {
	log hclog.Logger
	mu  sync.Mutex // guards runs
	// runs are the runs being carried out, by slot ID.
	runs map[string]*Run
}

// NewRuns returns an empty set of runs that logs to log.
func NewRuns(log hclog.Logger) *Runs {
	return &Runs{log: log, runs: map[string]*Run{}}
}

// New registers a run for slot id, or returns the one registered.
func (x *Runs) New(id string, release bool) (r *Run, created bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if r, ok := x.runs[id]; ok {
		return r, false
	}
	r = newRun(release, nil)
	x.runs[id] = r
	return r, true
}

// Release registers a release of slot id, or returns the release
// registered (joined). A spare being made (prev) goes first; the release
// takes its place at once, so that it is joined rather than started twice.
func (x *Runs) Release(id string) (r, prev *Run, joined bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	prev, ok := x.runs[id]
	if ok && prev.release {
		return prev, nil, true
	}
	r = newRun(true, prev)
	x.runs[id] = r
	return r, prev, false
}

// Running reports whether a run works on slot id.
func (x *Runs) Running(id string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.runs[id]
	return ok
}

// Any returns one of the runs being carried out, nil for none.
func (x *Runs) Any() *Run {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range x.runs {
		return r
	}
	return nil
}

// Carry runs fn as run r of slot id in a goroutine of its own. The run
// outlives the caller that started it (a Reserve that gives up, say):
// others may have joined it, and work cut short only costs a retry. Each
// command has its own deadline; runTimeout bounds the waits for the
// slot's lock.
func (x *Runs) Carry(ctx context.Context, id string, r *Run, what string, fn func(context.Context) error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runTimeout)
	go func() {
		defer func() {
			cancel()
			x.mu.Lock()
			if x.runs[id] == r {
				delete(x.runs, id)
			}
			x.mu.Unlock()
			close(r.done)
		}()
		r.err = fn(rctx)
		if r.err != nil {
			x.log.Error(what+" incomplete; retried at the next pass", "device", id, "error", r.err)
		}
	}()
}
