package allocwatch

import (
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

// stubHolds passes only an allocation on this node, pending or running,
// wanted running, whose task holds every device asked for among this
// plugin's devices; everything else says why.
func TestStubHolds(t *testing.T) {
	stub := func(edit func(s *api.AllocationListStub)) *api.AllocationListStub {
		a := alloc("a1", "default", "running", "scratch-0", "scratch-1")
		s := &api.AllocationListStub{ID: a.ID, NodeID: nodeID, ClientStatus: a.ClientStatus,
			DesiredStatus: api.AllocDesiredStatusRun, AllocatedResources: a.AllocatedResources}
		if edit != nil {
			edit(s)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		stub    *api.AllocationListStub
		task    string
		devices []string
		errHas  string // "" for nil
	}{
		{name: "running, holds both", stub: stub(nil), task: "task", devices: []string{"scratch-1", "scratch-0"}},
		{name: "pending", stub: stub(func(s *api.AllocationListStub) { s.ClientStatus = api.AllocClientStatusPending }), task: "task", devices: []string{"scratch-0"}},
		{name: "complete", stub: stub(func(s *api.AllocationListStub) { s.ClientStatus = api.AllocClientStatusComplete }), task: "task", devices: []string{"scratch-0"}, errHas: "is complete"},
		{name: "unknown (disconnected)", stub: stub(func(s *api.AllocationListStub) { s.ClientStatus = "unknown" }), task: "task", devices: []string{"scratch-0"}, errHas: "is unknown"},
		{name: "told to stop", stub: stub(func(s *api.AllocationListStub) { s.DesiredStatus = api.AllocDesiredStatusStop }), task: "task", devices: []string{"scratch-0"}, errHas: "wanted stop"},
		{name: "evicted", stub: stub(func(s *api.AllocationListStub) { s.DesiredStatus = api.AllocDesiredStatusEvict }), task: "task", devices: []string{"scratch-0"}, errHas: "wanted evict"},
		{name: "another node", stub: stub(func(s *api.AllocationListStub) { s.NodeID = "ffffffff-0000" }), task: "task", devices: []string{"scratch-0"}, errHas: "is on node ffffffff"},
		{name: "no resources in the answer", stub: stub(func(s *api.AllocationListStub) { s.AllocatedResources = nil }), task: "task", devices: []string{"scratch-0"}, errHas: "no allocated resources"},
		{name: "a device it does not hold", stub: stub(nil), task: "task", devices: []string{"scratch-0", "scratch-2"}, errHas: "does not hold scratch-2"},
		{name: "another task's", stub: stub(nil), task: "side", devices: []string{"scratch-0"}, errHas: `task "side"`},
		{name: "another vendor's ID", stub: stub(nil), task: "side", devices: []string{"GPU-1"}, errHas: "does not hold GPU-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := stubHolds(tc.stub, nodeID, tc.task, tc.devices)
			if tc.errHas == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.errHas)
		})
	}
}
