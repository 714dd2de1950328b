package zfs

import (
	"context"
	"sync"
	"time"
)

// DefaultMaxYield is how long a background command waits at most for the
// foreground commands running when it is about to start (Runner.MaxYield).
const DefaultMaxYield = 250 * time.Millisecond

// Every zfs command that changes a pool ends by waiting for a transaction
// group to be written, after the one being written when it arrived. When a
// node recycles many datasets at once (releases: renames, unmounts, new
// spares), a command that a task's start waits for (a Reserve's one
// `zfs set`) would wait behind all of that work. A command run with a
// context from Foreground goes first: while one runs, the other commands of
// the same Runner wait before they start, up to MaxYield each, so that the
// group the foreground command waits for is not also carrying them. A
// foreground command never waits for another command, but on zfs-fuse for
// one that mounts or unmounts when it does too (mountgate.go: 2 s at most).

// foregroundKey marks a context made by Foreground.
type foregroundKey struct{}

// Foreground returns ctx marked so that the Runner's commands run with it go
// before the others (see MaxYield). Mark only the commands that something
// waits for now (a Reserve): a context made from it for background work
// must not keep the mark, so pass the marked context to the call, not down.
func Foreground(ctx context.Context) context.Context {
	return context.WithValue(ctx, foregroundKey{}, true)
}

func isForeground(ctx context.Context) bool {
	fg, _ := ctx.Value(foregroundKey{}).(bool)
	return fg
}

// priority counts the foreground commands running. The zero value is ready.
type priority struct {
	mu sync.Mutex // guards n and idle
	n  int        // foreground commands running
	// idle is closed when n falls to zero; nil while n is zero.
	idle chan struct{}
}

// enter counts a foreground command in; leave counts it out.
func (p *priority) enter() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		p.idle = make(chan struct{})
	}
	p.n++
}

func (p *priority) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n--
	if p.n == 0 {
		close(p.idle)
		p.idle = nil
	}
}

// yield waits until no foreground command runs, max has passed, or ctx is
// done, and returns how long it waited.
func (p *priority) yield(ctx context.Context, max time.Duration) time.Duration {
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	if idle == nil || max <= 0 {
		return 0
	}
	start := time.Now()
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	case <-ctx.Done():
	}
	return time.Since(start)
}
