package allocs

// What the manager asks of the node's allocations (Nomad), answered from
// the allocation watcher's reads: the proof a Reserve reads (Holds) goes
// from here to allocwatch and the Nomad API, nothing in between.

import (
	"context"
	"errors"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// FromWatcher returns the Nomad that the running plugin gives the manager
// (SetNomad): the node's allocations as w reads them.
func FromWatcher(w *allocwatch.Watcher) Nomad { return nomadAllocs{w} }

// nomadAllocs adapts the watcher to what the manager asks.
type nomadAllocs struct{ w *allocwatch.Watcher }

// View returns a read of the node's allocations that began after since,
// with whether the token is known to see every namespace (see
// completeSince: a read that began before the token was known to is never
// complete).
func (n nomadAllocs) View(ctx context.Context, since time.Time) (*View, error) {
	snap, err := n.w.Fresh(ctx, since)
	if err != nil {
		return nil, err
	}
	return n.completeSince(ctx, snap)
}

// Latest returns the watcher's latest read, without reading again, but
// when it began before the token was known to see every namespace (see
// completeSince).
func (n nomadAllocs) Latest(ctx context.Context) (*View, error) {
	snap, err := n.w.Snapshot()
	switch {
	case err != nil:
		return nil, err
	case snap == nil:
		return nil, errors.New("the node's allocations have not been read yet")
	}
	return n.completeSince(ctx, snap)
}

// completeSince is snap as the slot manager reads it, complete only when
// the token is known to see every namespace and snap began after it was
// known to (VisibleSince): a read that began before may have been made
// while the token saw less (right after the plugin starts, or a policy
// widened or the token file replaced since), even though the check that
// follows it passes. Such a read is replaced by a new one, which is then
// complete or not on the same terms.
func (n nomadAllocs) completeSince(ctx context.Context, snap *allocwatch.Snapshot) (*View, error) {
	v, err := n.view(ctx, snap) // checks the token's visibility when due
	if err != nil || !v.Complete {
		return v, err
	}
	since := n.w.VisibleSince()
	if !since.IsZero() && !snap.Began.After(since) {
		if snap, err = n.w.Fresh(ctx, since.Add(time.Nanosecond)); err != nil {
			return nil, err
		}
		if v, err = n.view(ctx, snap); err != nil {
			return nil, err
		}
	}
	if since = n.w.VisibleSince(); since.IsZero() || !snap.Began.After(since) {
		v.Complete = false
		v.Incomplete = "the read of the node's allocations began before the token was known to see every namespace"
	}
	return v, nil
}

// Holds asks the API whether allocation o is live on this node with its
// task holding every device of ids.
func (n nomadAllocs) Holds(ctx context.Context, o record.Owner, ids []string) error {
	return n.w.Holds(ctx, o.Namespace, o.AllocID, o.Task, ids)
}

// Prior reads an allocation that another replaced, by ID.
func (n nomadAllocs) Prior(ctx context.Context, namespace, allocID string) (Prior, error) {
	return n.w.Prior(ctx, namespace, allocID)
}

// view is snap as the slot manager reads it, with whether the token is
// known to see every namespace.
func (n nomadAllocs) view(ctx context.Context, snap *allocwatch.Snapshot) (*View, error) {
	nodeID, err := n.w.NodeID(ctx)
	if err != nil {
		return nil, err
	}
	vis := n.w.Visibility(ctx)
	v := &View{Began: snap.Began, NodeID: nodeID, Allocs: make(map[string]Alloc, len(snap.Allocs)),
		Complete: vis.All, Incomplete: vis.Reason}
	if vis.All {
		v.Incomplete = ""
	}
	for id, a := range snap.Allocs {
		v.Allocs[id] = Alloc{
			Owner: record.Owner{AllocID: a.ID, Namespace: a.Namespace, Job: a.JobID, Group: a.TaskGroup, AllocName: a.Name, NodeID: nodeID,
				Parent: a.ParentJobID},
			ClientStatus: a.ClientStatus, Stopping: a.Stopping, Previous: a.Previous, Devices: a.Devices,
			Dead: a.DeadTasks, Started: a.StartedTasks,
		}
	}
	return v, nil
}

// Incomplete returns why the token may not see every namespace ("" when it
// sees them all).
func (n nomadAllocs) Incomplete(ctx context.Context) string {
	if vis := n.w.Visibility(ctx); !vis.All {
		return vis.Reason
	}
	return ""
}

// Gone asks the API whether an allocation absent from the node's list
// positively no longer exists.
func (n nomadAllocs) Gone(ctx context.Context, o record.Owner) (bool, error) {
	return n.w.Gone(ctx, o.Namespace, o.AllocID, o.Task)
}
