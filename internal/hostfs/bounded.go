package hostfs

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
)

// ErrStuck is wrapped by Do's error when an earlier call on the same path
// has not returned yet.
var ErrStuck = errors.New("an earlier call on this path has not returned")

// stuck counts, by cleaned path, the calls Do and Get gave up waiting for
// and that have not returned since; stuckMu guards it.
var (
	stuckMu sync.Mutex
	stuck   = map[string]int{}
)

// Do runs op, a call into the filesystem at path, and returns its error,
// or ctx's once ctx ends first. A path inside a FUSE mount (zfs-fuse)
// waits on the mount's daemon, and a daemon that hangs would hang the
// caller with it: often a slot's lock holder, which must not wait without
// a bound.
//
// When ctx ends first, op goes on running (with a goroutine that clears
// the mark once it returns) and its result is dropped; until it returns,
// every call of Do or Get on the same path fails at once with ErrStuck, so
// a hung daemon costs a bounded number of goroutines per path (two, or a
// few more when several calls on the path started together), not two per
// attempt. On return, either op has returned, or the error says it has
// not.
func Do(ctx context.Context, path string, op func() error) error {
	_, err := Get(ctx, path, func() (struct{}, error) { return struct{}{}, op() })
	return err
}

// Get is Do for a call that returns a value: the value is op's when the
// error is op's, and the zero value when Get gave up waiting.
func Get[T any](ctx context.Context, path string, op func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("%s: %w", path, err)
	}
	key := filepath.Clean(path)
	stuckMu.Lock()
	if stuck[key] > 0 {
		stuckMu.Unlock()
		return zero, fmt.Errorf("%s: %w", path, ErrStuck)
	}
	stuckMu.Unlock()
	done := make(chan result, 1) // buffered: op's goroutine never blocks on it
	go func() {
		v, err := op()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
	}
	stuckMu.Lock()
	defer stuckMu.Unlock()
	select {
	case r := <-done: // it returned meanwhile
		return r.v, r.err
	default:
	}
	stuck[key]++
	go func() {
		<-done
		stuckMu.Lock()
		if stuck[key]--; stuck[key] <= 0 {
			delete(stuck, key)
		}
		stuckMu.Unlock()
	}()
	return zero, fmt.Errorf("%s: no answer from the filesystem: %w", path, ctx.Err())
}
