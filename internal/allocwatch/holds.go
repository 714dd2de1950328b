package allocwatch

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// Holds reports, from a read of allocation allocID made now, whether it is
// live on this node and its task holds every one of deviceIDs: client
// status pending or running, desired status run, node this watcher's, and
// each device among the task's devices of this plugin. It returns nil only
// then; anything else, the read failing included, is an error that says
// why.
//
// The read is the namespace-scoped list by ID prefix with the allocated
// resources and without task states: one small stub, whatever the node's
// history (the node's list carries the job of every allocation it still
// holds). A Reserve asks it for the allocation a slot was prepared for: a
// complete view showed that allocation the slot's only live holder, and
// while it stays live and wanted no other allocation can be placed on the
// device, so the asker can only be it (see the Reserve of package slots/prepare).
func (w *Watcher) Holds(ctx context.Context, namespace, allocID, task string, deviceIDs []string) error {
	if allocID == "" || task == "" {
		return fmt.Errorf("no allocation or task to look up")
	}
	if !validNamespace.MatchString(namespace) {
		return fmt.Errorf("allocation %s: namespace %q is not a Nomad namespace name", short(allocID), namespace)
	}
	if err := w.refreshToken(); err != nil {
		return err
	}
	nodeID, err := w.NodeID(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	q := (&api.QueryOptions{Namespace: namespace, Prefix: allocID,
		Params: map[string]string{"resources": "true", "task_states": "false"}}).WithContext(ctx)
	stubs, _, err := w.client.Allocations().List(q)
	if err != nil {
		err = fmt.Errorf("looking up allocation %s in namespace %q: %w", short(allocID), namespace, classify(err))
		w.readFailed(CallAllocation, err)
		return err
	}
	for _, s := range stubs {
		if s != nil && s.ID == allocID {
			return stubHolds(s, nodeID, task, deviceIDs)
		}
	}
	return fmt.Errorf("allocation %s is not found in namespace %q", short(allocID), namespace)
}

// stubHolds is Holds' judgment of one stub.
func stubHolds(s *api.AllocationListStub, nodeID, task string, deviceIDs []string) error {
	switch {
	case s.NodeID != nodeID:
		return fmt.Errorf("allocation %s is on node %s, not %s", short(s.ID), short(s.NodeID), short(nodeID))
	case s.ClientStatus != api.AllocClientStatusPending && s.ClientStatus != api.AllocClientStatusRunning:
		return fmt.Errorf("allocation %s is %s", short(s.ID), s.ClientStatus)
	case s.DesiredStatus != api.AllocDesiredStatusRun:
		return fmt.Errorf("allocation %s is wanted %s", short(s.ID), s.DesiredStatus)
	case s.AllocatedResources == nil:
		return fmt.Errorf("allocation %s: the answer has no allocated resources", short(s.ID))
	}
	held := map[string]bool{}
	if tr := s.AllocatedResources.Tasks[task]; tr != nil {
		for _, d := range tr.Devices {
			if d != nil && d.Vendor == deviceVendor && d.Type == deviceType {
				for _, id := range d.DeviceIDs {
					held[id] = true
				}
			}
		}
	}
	var missing []string
	for _, id := range deviceIDs {
		if !held[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("task %q of allocation %s does not hold %s", task, short(s.ID), strings.Join(missing, ", "))
	}
	return nil
}
