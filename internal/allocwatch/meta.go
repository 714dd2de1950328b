package allocwatch

import (
	"context"
	"fmt"

	"github.com/hashicorp/nomad/api"
)

// SetNodeMeta sets (a nil value: removes) keys of the node's dynamic
// metadata (POST /v1/client/metadata, which needs node:write). The error
// matches ErrPermission when the token may not. The call ends by ctx's
// deadline, or within callTimeout.
func (w *Watcher) SetNodeMeta(ctx context.Context, meta map[string]*string) error {
	if err := w.refreshToken(); err != nil {
		return err
	}
	nodeID, err := w.NodeID(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	q := (&api.QueryOptions{}).WithContext(ctx)
	if _, err := w.client.Nodes().Meta().Apply(&api.NodeMetaApplyRequest{NodeID: nodeID, Meta: meta}, q); err != nil {
		return fmt.Errorf("setting node metadata through %s: %w", w.client.Address(), classify(err))
	}
	return nil
}
