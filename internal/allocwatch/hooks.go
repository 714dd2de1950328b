package allocwatch

import (
	"context"
	"errors"
)

// Calls of the Nomad API that an Observer is told failed.
const (
	CallNodeAllocations = "node_allocations" // GET /v1/node/:id/allocations
	CallAllocation      = "allocation"       // the lookup of one allocation (Gone)
	CallVisibility      = "visibility"       // the check of the namespaces the token sees
	CallNodeID          = "node_id"          // learning the node's ID
)

// Observer is told of failed reads of the Nomad API, for metrics.
// ReadFailed is called on the goroutine that read, with no lock of the
// watcher held: it must be quick and must not block.
type Observer interface {
	// ReadFailed reports one failed read: call is one of the Call
	// constants, err the error (wrapping ErrPermission for a 403).
	ReadFailed(call string, err error)
}

// SetObserver sets what is told of failed API reads (nil for nothing).
func (w *Watcher) SetObserver(o Observer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.obs = o
}

// readFailed tells the observer, if any, that call failed with err. A read
// cut short by its caller's cancellation (the plugin stopping) is not a
// failure of the API.
func (w *Watcher) readFailed(call string, err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	w.mu.Lock()
	o := w.obs
	w.mu.Unlock()
	if o != nil {
		o.ReadFailed(call, err)
	}
}
