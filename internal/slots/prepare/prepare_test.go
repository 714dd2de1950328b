package prepare

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
)

// TestPreparable: a slot is prepared only for a holder whose task has not
// started and whose allocation the Reserve's proof will find pending or
// running and wanted running. The preparations themselves are tested in
// slots' prepare_test.go, on a real pool and a real Nomad agent.
func TestPreparable(t *testing.T) {
	owner := record.Owner{AllocID: "a-1", Task: "t"}
	for _, tc := range []struct {
		name    string
		alloc   *allocs.Alloc // nil: not in the view
		started bool
		want    bool
	}{
		{"pending, not started", &allocs.Alloc{ClientStatus: "pending"}, false, true},
		{"running, not started", &allocs.Alloc{ClientStatus: "running"}, false, true},
		{"running, its task started", &allocs.Alloc{ClientStatus: "running"}, true, false},
		{"told to stop", &allocs.Alloc{ClientStatus: "pending", Stopping: true}, false, false},
		{"failed", &allocs.Alloc{ClientStatus: "failed"}, false, false},
		{"complete", &allocs.Alloc{ClientStatus: "complete"}, false, false},
		{"not in the view", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &allocs.View{Allocs: map[string]allocs.Alloc{}}
			if tc.alloc != nil {
				a := *tc.alloc
				a.Owner = owner
				v.Allocs[owner.AllocID] = a
			}
			must.Eq(t, tc.want, preparable(v, allocs.Holding{Owner: owner, Started: tc.started}))
		})
	}
}
