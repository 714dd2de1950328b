package slots

// The manager's loops: what wakes the preparation, the owner records and
// the release passes, and how wake-ups coalesce.

import (
	"context"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
)

// Run records owners and starts the release of the slots of ended
// allocations whenever it is kicked (after Reserve, and by the caller on
// every new allocation list) and every period, until ctx is done. It never
// waits for a release: each runs in its own goroutine (see goRelease), so
// that the end of one allocation is acted on while another slot's release
// is still running.
//
// Three loops share each wake-up: the preparation of slots for
// allocations just placed (package prepare), the owners identified at Reserve
// (recordOwners: ZFS only), and the release passes, each a loop.Run. Run
// itself only wakes them, at each kick and each period; the release passes
// keep the period on a timer of their own, which kicks never put off. None
// waits for another: a hung or slow API holds up only the loops that read
// it, never the owner records. A release pass resumes the releases already
// begun before it reads the API. Each loop coalesces the wake-ups that
// come while it works into one more round.
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
	prep, owners, kicked := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)
	go loop.Run(ctx, loop.Config{Name: "slot preparation", Log: m.log, Kick: prep}, func(ctx context.Context, _ loop.Wake) loop.Next {
		// Allocations just placed: their Reserve may come at any moment,
		// and waits for what this starts.
		if _, err := m.preparer.Prepare(ctx); err != nil && ctx.Err() == nil {
			m.log.Debug("no slot prepared", "error", err)
		}
		return loop.Next{}
	})
	go loop.Run(ctx, loop.Config{Name: "owner records", Log: m.log, Kick: owners}, func(ctx context.Context, _ loop.Wake) loop.Next {
		err := m.recordOwners(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			m.log.Error("owners identified at Reserve not recorded yet; the next pass retries", "error", err)
		case err == nil && m.ownersPending():
			// Left for a slot busy with other work (the spare made
			// behind its Reserve, say): again shortly.
			return loop.After(ownerRetry)
		}
		return loop.Next{}
	})
	// The release passes: a kicked one decides from a recent read (see
	// above), the periodic one reads anew (since), and serves a kick that
	// came meanwhile too.
	passes := loop.Config{Name: "release passes", Log: m.log, First: loop.After(period), Kick: kicked}
	go loop.Run(ctx, passes, func(ctx context.Context, w loop.Wake) loop.Next {
		var since time.Time // a kick: any read after the latest Reserve (release.Passer.Start)
		next := loop.Next{}
		if w.Timer {
			since, next = time.Now(), loop.After(period)
		}
		if _, err := m.releasePass(ctx, since); err != nil && ctx.Err() == nil {
			m.log.Error("release pass incomplete", "error", err)
		}
		return next
	})
	// Run itself only hands each wake-up to the three.
	wakes := loop.Config{Name: "slot manager", Log: m.log, First: loop.After(period), Kick: m.kick}
	loop.Run(ctx, wakes, func(_ context.Context, w loop.Wake) loop.Next {
		loop.Kick(prep)
		loop.Kick(owners)
		if w.Kick {
			loop.Kick(kicked)
		}
		if w.Timer {
			return loop.After(period)
		}
		return loop.Next{}
	})
}

// ownerRetry is how soon the owner loop tries again to record an owner
// left pending because its slot was busy.
const ownerRetry = 250 * time.Millisecond

// wake sends a wake-up on ch (Run's kick) without blocking: ch has room
// for one, and one waiting is enough.
func wake(ch chan<- struct{}) { loop.Kick(ch) }
