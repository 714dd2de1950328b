package slots

// The manager's loops: what wakes the preparation, the owner records and
// the release passes, and how wake-ups coalesce.

import (
	"context"
	"time"
)

// Run records owners and starts the release of the slots of ended
// allocations whenever it is kicked (after Reserve, and by the caller on
// every new allocation list) and every period, until ctx is done. It never
// waits for a release: each runs in its own goroutine (see goRelease), so
// that the end of one allocation is acted on while another slot's release
// is still running.
//
// Three loops share each wake-up: the preparation of slots for
// allocations just placed (prepare.go), the owners identified at Reserve
// (recordOwners: ZFS only), and the release passes. Run itself only wakes
// them. None waits for another: a hung or slow API holds up only the loops
// that read it, never the owner records. A release pass resumes the
// releases already begun before it reads the API. Each loop coalesces the
// wake-ups that come while it works into one more round.
//
// A pass that a kick starts decides from the latest read of the
// allocations when that read began after the latest Reserve arrived (the
// read that a new allocation list kicks with, or the Reserve's own) and
// the read after it did not fail, and it reads again otherwise; a slot
// whose owner is unknown is decided only from a read made for the pass.
// Under a churn of short jobs the changes of allocations kick often (the
// watcher reads at most once per 200 ms while they keep coming), and the
// node's list, which carries the job of every allocation it still holds,
// is the plugin's largest cost. The periodic pass always reads anew, so
// that an API that stopped answering shows in the slots' health within a
// period.
func (m *Manager) Run(ctx context.Context, period time.Duration) {
	prep, owners := make(chan struct{}, 1), make(chan struct{}, 1)
	kicked, periodic := make(chan struct{}, 1), make(chan struct{}, 1)
	go rounds(ctx, prep, func() {
		// Allocations just placed: their Reserve may come at any moment,
		// and waits for what this starts.
		if _, err := m.prepare(ctx); err != nil && ctx.Err() == nil {
			m.log.Debug("no slot prepared", "error", err)
		}
	})
	go rounds(ctx, owners, func() {
		err := m.recordOwners(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			m.log.Error("owners identified at Reserve not recorded yet; the next pass retries", "error", err)
		case err == nil && m.ownersPending():
			// Left for a slot busy with other work (the spare made
			// behind its Reserve, say): again shortly.
			time.AfterFunc(ownerRetry, func() { wake(owners) })
		}
	})
	go m.passes(ctx, kicked, periodic)
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
			wake(kicked)
		case <-timer.C:
			timer.Reset(period)
			wake(periodic)
		}
		wake(prep)
		wake(owners)
	}
}

// ownerRetry is how soon the owner loop tries again to record an owner
// left pending because its slot was busy.
const ownerRetry = 250 * time.Millisecond

// passes runs a release pass for each wake-up on kicked (see Run) and a
// periodic one, reading anew, for each on periodic, until ctx is done.
func (m *Manager) passes(ctx context.Context, kicked, periodic <-chan struct{}) {
	for {
		var since time.Time // a kick: any read after the latest Reserve (startReleases)
		select {
		case <-ctx.Done():
			return
		case <-kicked:
		case <-periodic:
			since = time.Now()
		}
		if _, err := m.releasePass(ctx, since); err != nil && ctx.Err() == nil {
			m.log.Error("release pass incomplete", "error", err)
		}
	}
}

// rounds calls round once for each wake-up on ch (those that come while a
// round runs make one more round), until ctx is done.
func rounds(ctx context.Context, ch <-chan struct{}, round func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			round()
		}
	}
}

// wake sends a wake-up on ch (a rounds loop's, or Run's kick) without
// blocking: ch has room for one, and one waiting is enough.
func wake(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
