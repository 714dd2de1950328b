package allocwatch

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/hashicorp/nomad/api"
)

// visRecheck is how often the token's namespace visibility is checked
// again: a policy edited in place (a namespace rule dropped) is seen within
// it. A check is a handful of small GETs. A check that failed (the API
// down, or "no cluster leader" while the agent starts) is tried again on
// the next call after visRetry, or at once when a read of the node's
// allocations has succeeded since it (the API answers again): until one
// succeeds, no view is complete and no owner can be identified, so a
// Reserve that reads the allocations must not wait out visRetry on a
// check that failed before its read.
const (
	visRecheck = 30 * time.Second
	visRetry   = 2 * time.Second
)

// Fresh returns a snapshot of the node's allocations read by a request that
// began at or after since: the latest snapshot when it qualifies, else the
// answer of a non-blocking, consistent read started for it (shared by every
// caller that can use it). The latest snapshot is not used while the read
// after it failed: the caller then learns that the API does not answer,
// rather than decide from what it said before. It returns an error when the
// read fails or ctx is done first; the read itself has its own deadline
// (callTimeout), so it never outlives its use for long.
func (w *Watcher) Fresh(ctx context.Context, since time.Time) (*Snapshot, error) {
	w.mu.Lock()
	if w.snap != nil && !w.snap.Began.Before(since) && w.lastErr == nil {
		s := w.snap
		w.mu.Unlock()
		return s, nil
	}
	f := w.flight
	if f == nil || f.began.Before(since) || f.failed() {
		f = &flight{began: time.Now(), done: make(chan struct{})}
		w.flight = f
		go w.fly(f)
	}
	w.mu.Unlock()
	select {
	case <-f.done:
		return f.snap, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a read of the node's allocations: %w", ctx.Err())
	}
}

// failed reports whether the read has answered with an error: a caller
// that comes after that reads anew rather than take the old error.
func (f *flight) failed() bool {
	select {
	case <-f.done:
		return f.err != nil
	default:
		return false
	}
}

// fly runs one shared non-blocking read.
func (w *Watcher) fly(f *flight) {
	defer close(f.done)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	f.snap, f.err = w.read(ctx, 0)
	if f.err != nil {
		w.setErr(f.err)
		return
	}
	w.setSnapshot(f.snap)
}

// Gone reports whether allocation allocID of namespace positively no longer
// exists, from a namespace-scoped list by ID prefix: Nomad answers it with
// 403 when the token may not read that namespace, where a read by ID would
// answer 404 and be mistaken for "gone". An allocation that exists but is
// not in the node's list is an error (the list is stale, or the token
// cannot see it there), unless it has ended for task (stubEnded): any
// doubt means keep.
func (w *Watcher) Gone(ctx context.Context, namespace, allocID, task string) (bool, error) {
	if namespace == "" {
		return false, fmt.Errorf("allocation %s is not in the node's list and its namespace is unknown", short(allocID))
	}
	if !validNamespace.MatchString(namespace) {
		// "*" would list every namespace the token may read and silently
		// leave out the others: an absent allocation would look gone.
		return false, fmt.Errorf("allocation %s: recorded namespace %q is not a Nomad namespace name", short(allocID), namespace)
	}
	if err := w.refreshToken(); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	q := (&api.QueryOptions{Namespace: namespace, Prefix: allocID}).WithContext(ctx)
	stubs, _, err := w.client.Allocations().List(q)
	if err != nil {
		err = fmt.Errorf("looking up allocation %s in namespace %q: %w", short(allocID), namespace, classify(err))
		w.readFailed(CallAllocation, err)
		return false, err
	}
	for _, s := range stubs {
		if s.ID == allocID {
			if stubEnded(s, task) {
				return true, nil
			}
			return false, fmt.Errorf("allocation %s is %s but missing from the node's allocation list", short(allocID), s.ClientStatus)
		}
	}
	return true, nil
}

// stubEnded says whether an allocation missing from the node's list has
// ended for task: complete, or failed with the task dead (with no task
// named, every task dead). Nomad reports an allocation failed as soon as
// one task fails, while its poststop tasks have still to run. A lost one
// is never taken for ended here.
func stubEnded(s *api.AllocationListStub, task string) bool {
	switch s.ClientStatus {
	case api.AllocClientStatusComplete:
		return true
	case api.AllocClientStatusFailed:
		dead := func(name string) bool { ts := s.TaskStates[name]; return ts != nil && ts.State == "dead" }
		if task != "" {
			return dead(task)
		}
		for name := range s.TaskStates {
			if !dead(name) {
				return false
			}
		}
		return len(s.TaskStates) > 0
	}
	return false
}

// VisibleSince returns since when the token has been known to see every
// namespace: when the check began that first found it so, after a check
// that did not or a change of the token. It is zero while that is not
// known. A read of the node's allocations that began before it may have
// been made while the token saw less (a policy widened, a token file
// replaced): only the reads after it are complete.
func (w *Watcher) VisibleSince() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.visAllSince
}

// validNamespace is Nomad's rule for namespace names (structs.validNamespaceName).
var validNamespace = regexp.MustCompile("^[a-zA-Z0-9-]{1,128}$")

// Visibility returns whether the token is known to see every namespace,
// checking again at start, whenever the token file changed, every
// visRecheck, and after a check that failed: visRetry after it, or at
// once when a read of the node's allocations began after it and succeeded.
// A check that fails is "not known".
func (w *Watcher) Visibility(ctx context.Context) Visibility {
	if err := w.refreshToken(); err != nil {
		return Visibility{Reason: err.Error()}
	}
	w.mu.Lock()
	answered := w.snap != nil && w.lastErr == nil && w.snap.Began.After(w.visAt)
	due := w.visAt.IsZero() || w.visStale || time.Since(w.visAt) > visRecheck ||
		(w.visErr != nil && (time.Since(w.visAt) > visRetry || answered))
	v, verr := w.vis, w.visErr
	w.mu.Unlock()
	if due {
		began := time.Now()
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		v, verr = CheckVisibility(ctx, w.client)
		cancel()
		w.mu.Lock()
		switch {
		case verr != nil || !v.All:
			w.visAllSince = time.Time{}
		case w.visAllSince.IsZero(): // none before, or the token changed (refreshToken)
			w.visAllSince = began
		}
		w.vis, w.visErr, w.visAt, w.visStale = v, verr, time.Now(), false
		w.mu.Unlock()
		w.readFailed(CallVisibility, verr)
		switch {
		case verr != nil:
			w.log.Warn("cannot tell whether the Nomad token sees every namespace", "error", verr)
		case !v.All:
			w.log.Warn("the Nomad token does not see every namespace", "reason", v.Reason)
		default:
			w.log.Debug("the Nomad token sees every namespace")
		}
	}
	if verr != nil {
		return Visibility{Reason: fmt.Sprintf("cannot tell whether the Nomad token sees every namespace: %v", verr)}
	}
	return v
}
