package allocwatch

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Ping asks the API for the cluster's leader (/v1/status/leader, which
// needs no ACL) through the address, TLS settings and token the watcher
// uses: a nil error means the agent answered. For the operator's
// `doctor`; the call ends by ctx's deadline, or within callTimeout.
func (w *Watcher) Ping(ctx context.Context) (leader string, err error) {
	if err := w.refreshToken(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	q := (&api.QueryOptions{}).WithContext(ctx)
	if _, err := w.client.Raw().Query("/v1/status/leader", &leader, q); err != nil {
		return "", fmt.Errorf("nomad API at %s: %w", w.client.Address(), classify(err))
	}
	return leader, nil
}

// NodeAllocations reads the node's allocations once, now: the read the
// plugin relies on to release and hand over datasets. For the operator's
// `status` and `doctor`.
func (w *Watcher) NodeAllocations(ctx context.Context) (*Snapshot, error) {
	return w.Fresh(ctx, time.Now())
}
