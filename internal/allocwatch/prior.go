package allocwatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/hashicorp/nomad/api"
)

// Prior is what a restore needs to know of the allocation another one
// replaced (its PreviousAllocation): where it ran, whether it is over,
// whether its tasks ran, which of the plugin's devices they held, and the
// allocation it replaced in turn.
type Prior struct {
	// Exists is false when Nomad no longer has the allocation (collected);
	// the other fields are then empty.
	Exists bool
	ID     string
	NodeID string
	// ClientStatus is Nomad's client status (pending, running, complete,
	// failed, lost, unknown).
	ClientStatus string
	// Previous is the allocation this one replaced; "" for none.
	Previous string
	// Devices maps each of the plugin's device IDs the allocation held to
	// the task that held it; Started lists the tasks that ran (running, or
	// with a start time): one that never started was never handed a
	// dataset, nor wrote one.
	Devices map[string]string
	Started map[string]bool
}

// priorAlloc is the part of GET /v1/allocation/:id that Prior keeps.
type priorAlloc struct {
	leanAlloc
	NodeID string
}

// Prior reads allocation allocID of namespace, by ID (one allocation, its
// job included): Exists false when Nomad answers 404. The caller asks it
// of an allocation its asker replaced, in the asker's namespace, which a
// complete read of the node's allocations showed the token can read
// (where it cannot, Nomad answers 404 too: see Gone). Any other failure is
// an error.
func (w *Watcher) Prior(ctx context.Context, namespace, allocID string) (Prior, error) {
	if allocID == "" {
		return Prior{}, errors.New("no allocation to look up")
	}
	if !validNamespace.MatchString(namespace) {
		return Prior{}, fmt.Errorf("allocation %s: namespace %q is not a Nomad namespace name", short(allocID), namespace)
	}
	if err := w.refreshToken(); err != nil {
		return Prior{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var a priorAlloc
	q := (&api.QueryOptions{Namespace: namespace}).WithContext(ctx)
	if _, err := w.client.Raw().Query("/v1/allocation/"+url.PathEscape(allocID), &a, q); err != nil {
		var ure api.UnexpectedResponseError
		if errors.As(err, &ure) && ure.StatusCode() == http.StatusNotFound {
			return Prior{ID: allocID}, nil
		}
		err = fmt.Errorf("looking up allocation %s in namespace %q: %w", short(allocID), namespace, classify(err))
		w.readFailed(CallAllocation, err)
		return Prior{}, err
	}
	if a.ID != allocID {
		return Prior{}, fmt.Errorf("looking up allocation %s in namespace %q: the answer is of allocation %q", short(allocID), namespace, a.ID)
	}
	c := convert(&a.leanAlloc)
	return Prior{Exists: true, ID: a.ID, NodeID: a.NodeID, ClientStatus: a.ClientStatus, Previous: a.PreviousAllocation,
		Devices: c.Devices, Started: c.StartedTasks}, nil
}
