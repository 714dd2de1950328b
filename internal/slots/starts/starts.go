// Package starts holds when tasks' starts are under way, which the slot
// manager's background work yields to.
//
// When Nomad places an allocation on a slot whose tenant just ended, the
// slot's spare serves it at once, and the ended tenant's dataset is
// released beside the new tenant's start. That start is Nomad's: the
// client launches logmon, the executor and the task, which under churn
// take some 200-400 ms, and a release's zfs processes (and on zfs-fuse
// the daemon's work for them) compete with those launches for the CPUs.
// Nothing waits for that release but the slot's next spare. So the
// manager's background runs wait for a start under way before they begin
// their zfs work, at points where they hold no slot's lock: nothing that
// a Reserve or an owner's record waits for is ever delayed by a start,
// and a run that a Reserve joins stops waiting at once (release.Run.Hurry).
package starts

import (
	"context"
	"sync"
	"time"
)

// Default is how long background slot work yields to a task's start
// (the manager's SetStartYield) by default: from the slot's preparation at
// placement, or from its Reserve, to about when Nomad's launches for the
// task are over on a busy 2-core node.
const Default = 400 * time.Millisecond

// Yield is when tasks' starts are under way: one part of the slot
// manager, with its own lock. The zero value yields to nothing.
type Yield struct {
	mu    sync.Mutex    // guards d, until and reset
	d     time.Duration // how long a start is yielded to; 0: none
	until time.Time     // the end of the latest start's yield
	// reset is closed, and replaced, when d is set: the waits under way
	// end then. nil until the first wait.
	reset chan struct{}
}

// Set sets how long a start is yielded to from now on, and ends the waits
// under way.
func (y *Yield) Set(d time.Duration) {
	y.mu.Lock()
	defer y.mu.Unlock()
	y.d, y.until = max(d, 0), time.Time{}
	if y.reset != nil {
		close(y.reset)
		y.reset = nil
	}
}

// Begin notes that a task's start is under way from now.
func (y *Yield) Begin() {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.d == 0 {
		return
	}
	if until := time.Now().Add(y.d); until.After(y.until) {
		y.until = until
	}
}

// Wait returns once no start noted by Begin is under way, hurry is
// closed, ctx is done or Set is called, and returns how long it waited.
// It waits at most y.d however many starts begin meanwhile, so that work
// that yields is delayed, never starved. The caller holds no slot's lock.
func (y *Yield) Wait(ctx context.Context, hurry <-chan struct{}) time.Duration {
	y.mu.Lock()
	left := time.Until(y.until)
	if left > 0 && y.reset == nil {
		y.reset = make(chan struct{})
	}
	reset := y.reset
	y.mu.Unlock()
	if left <= 0 {
		return 0
	}
	start := time.Now()
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
	case <-hurry:
	case <-reset:
	case <-ctx.Done():
	}
	return time.Since(start)
}
