// Package allocs is what the slot manager asks of the node's allocations
// (Nomad), the views it reads them in, and the answer from the allocation
// watcher (FromWatcher): the proof a Reserve reads goes from the manager
// through here to allocwatch and the Nomad API, nothing in between.
package allocs

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// Nomad is what the manager needs to know of allocations. Every method takes
// a context with a deadline; an error always means "not known", and the
// manager then keeps the data. A nil Nomad means nothing is ever released,
// and a slot that a tenant may have written is never handed over.
type Nomad interface {
	// View returns the node's allocations as read by a request that began
	// after since: the latest read when it is recent enough, else a new one.
	// It returns an error when no such read succeeded before ctx is done.
	View(ctx context.Context, since time.Time) (*View, error)
	// Gone reports whether an allocation that a view does not list
	// positively no longer exists, from a read the token is allowed to make
	// in the allocation's namespace. Any doubt is an error.
	Gone(ctx context.Context, o record.Owner) (bool, error)
	// Incomplete returns why the token may not see the allocations of
	// every namespace, or "" when it is known to see them all. It is asked
	// on every release pass, so it answers from a cache and calls the API
	// (with a deadline) only when its answer may have changed.
	Incomplete(ctx context.Context) string
	// Latest returns the latest read of the node's allocations, whenever
	// it began, without reading again; an error when there is none or the
	// read after it failed.
	Latest(ctx context.Context) (*View, error)
	// Holds reports, from a read of allocation o made now, whether it is
	// live on this node (pending or running, and wanted running) and its
	// task o.Task holds every device of ids: nil only then, any doubt an
	// error. One small read, whatever the node's history.
	Holds(ctx context.Context, o record.Owner, ids []string) error
	// Prior reads allocation allocID of namespace, one the asker of a
	// Reserve replaced (Alloc.Previous), by ID: Exists false when Nomad no
	// longer has it. Any doubt is an error.
	Prior(ctx context.Context, namespace, allocID string) (Prior, error)
}

// Prior is what a read by ID says of an allocation that another replaced
// (the allocation watcher's answer, as it is).
type Prior = allocwatch.Prior

// View is one read of the node's allocations.
type View struct {
	// Began is when the read was sent.
	Began time.Time
	// NodeID is the node whose allocations these are.
	NodeID string
	// Allocs holds every allocation of the read, by ID.
	Allocs map[string]Alloc
	// Complete is true when the token is known to see every namespace;
	// Incomplete says why it is not.
	Complete   bool
	Incomplete string
}

// Alloc is what a view says of one allocation.
type Alloc struct {
	Owner record.Owner // Task is empty: see Devices
	// ClientStatus is Nomad's client status (pending, running, complete,
	// failed, lost).
	ClientStatus string
	// Stopping: the servers want it stopped; not ended yet.
	Stopping bool
	// Previous is the allocation it replaced (rescheduled, migrated off a
	// drained or lost node, updated destructively); "" for none.
	Previous string
	// Devices maps each of the plugin's device IDs the allocation holds to
	// the task that holds it.
	Devices map[string]string
	// Dead and Started list tasks by name: Dead ended, Started has run (its
	// state is running or dead, or it has a start time).
	Dead, Started map[string]bool
}

// Ended reports whether the allocation has positively stopped for task:
// client status complete, or failed or lost with the task dead. Nomad
// reports an allocation failed as soon as one task fails, while its
// poststop tasks have still to run (and Reserve their devices): failed
// alone says nothing of the other tasks.
func (a Alloc) Ended(task string) bool {
	switch a.ClientStatus {
	case "complete":
		return true
	case "failed", "lost":
		return a.Dead[task]
	}
	return false
}

// Holding is one live allocation's task that holds a device.
type Holding struct {
	Owner record.Owner
	// Started: the holding task has started, so it was handed a dataset.
	Started bool
}

// Holders returns the live allocations that hold device id, sorted by
// allocation ID.
func (v *View) Holders(id string) []Holding {
	var out []Holding
	for _, a := range v.Allocs {
		task, ok := a.Devices[id]
		if !ok || a.Ended(task) {
			continue
		}
		o := a.Owner
		o.Task, o.NodeID = task, v.NodeID
		out = append(out, Holding{Owner: o, Started: a.Started[task]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Owner.AllocID < out[j].Owner.AllocID })
	return out
}

// Fate is what is known of an owner allocation.
type Fate struct {
	// Ended: it has positively stopped on this node, or no longer exists.
	Ended bool
	// Stopping: not ended, but the servers want it stopped.
	Stopping bool
	Reason   string
}

// FateOf says what the view, and when it does not list the owner a
// namespace-scoped lookup, say of o. It makes a Nomad call only for an
// owner that the view does not list; any doubt is an error.
func FateOf(ctx context.Context, n Nomad, v *View, o record.Owner) (Fate, error) {
	if o.NodeID != "" && v.NodeID != "" && o.NodeID != v.NodeID {
		return Fate{}, fmt.Errorf("%s was recorded on node %s, but this plugin now watches node %s", o, record.ShortID(o.NodeID), record.ShortID(v.NodeID))
	}
	if a, ok := v.Allocs[o.AllocID]; ok {
		if a.Ended(o.Task) {
			return Fate{Ended: true, Reason: fmt.Sprintf("allocation %s is %s", record.ShortID(o.AllocID), a.ClientStatus)}, nil
		}
		return Fate{Stopping: a.Stopping, Reason: fmt.Sprintf("allocation %s is %s", record.ShortID(o.AllocID), a.ClientStatus)}, nil
	}
	gone, err := n.Gone(ctx, o)
	switch {
	case err != nil:
		return Fate{}, err
	case gone:
		return Fate{Ended: true, Reason: fmt.Sprintf("allocation %s no longer exists", record.ShortID(o.AllocID))}, nil
	}
	return Fate{}, fmt.Errorf("%s exists but is not in the node's allocation list", o)
}
