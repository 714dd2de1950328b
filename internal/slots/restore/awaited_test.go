package restore

import (
	"context"
	"errors"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
)

// priors answers Prior from a map (a missing ID: no longer exists) and
// counts the reads; the other questions are not asked of it.
type priors struct {
	allocs.Nomad
	by    map[string]allocs.Prior
	err   error
	reads int
}

func (p *priors) Prior(_ context.Context, _, id string) (allocs.Prior, error) {
	p.reads++
	if p.err != nil {
		return allocs.Prior{}, p.err
	}
	got, ok := p.by[id]
	if !ok {
		return allocs.Prior{ID: id}, nil
	}
	got.Exists, got.ID = true, id
	return got, nil
}

// TestAwaited: whose data a restore waits for, from what Nomad says of the
// allocations the asker replaced. The fake stands for Nomad's answers
// only; the wait itself runs on real pools (backup's
// TestBackup_ARestoreWaitsForItsPredecessorsFinalData) and a real
// two-client Nomad (e2e TestRestoreAcrossNodes_WaitsForItsPredecessor).
func TestAwaited(t *testing.T) {
	const here, there, class = "node-here", "node-there", "state"
	ran := func(node, status, previous string, devices map[string]string) allocs.Prior {
		return allocs.Prior{NodeID: node, ClientStatus: status, Previous: previous, Devices: devices, Started: map[string]bool{"t": true}}
	}
	never := func(node, previous string) allocs.Prior {
		return allocs.Prior{NodeID: node, ClientStatus: "failed", Previous: previous, Devices: map[string]string{"state-0": "t"}}
	}
	held := map[string]string{"state-1": "t", "state-0": "t", "scratch-2": "t"}
	want := func(alloc string, passed ...string) record.Awaited {
		return record.Awaited{Alloc: alloc, Node: there, Slots: []int{0, 1}, Passed: passed}
	}
	for _, tc := range []struct {
		name      string
		previous  string
		by        map[string]allocs.Prior
		err       error
		want      record.Awaited
		wantErr   string
		wantReads int
	}{
		{name: "no predecessor"},
		{name: "complete elsewhere", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "complete", "", held)}, want: want("p1"), wantReads: 1},
		{name: "failed elsewhere", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "failed", "", held)}, want: want("p1"), wantReads: 1},
		{name: "still running elsewhere (stopping)", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "running", "", held)}, want: want("p1"), wantReads: 1},
		{name: "lost with its node", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "lost", "", held)}, wantReads: 1},
		{name: "its node disconnected", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "unknown", "", held)}, wantReads: 1},
		{name: "ran on this node", previous: "p1", by: map[string]allocs.Prior{"p1": ran(here, "complete", "", held)}, wantReads: 1},
		{name: "collected", previous: "p1", wantErr: "no longer known to Nomad", wantReads: 1},
		{name: "held no device of the class", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "complete", "", map[string]string{"scratch-0": "t"})}, wantReads: 1},
		{name: "another task held it", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "complete", "", map[string]string{"state-0": "other"})}, wantReads: 1},
		{name: "a class whose name the other's begins with", previous: "p1", by: map[string]allocs.Prior{"p1": ran(there, "complete", "", map[string]string{"state-x-0": "t", "state-01": "t"})}, wantReads: 1},
		{name: "never ran: the one before it", previous: "p2", by: map[string]allocs.Prior{
			"p2": never(there, "p1"), "p1": ran(there, "complete", "", held)}, want: want("p1", "p2"), wantReads: 2},
		{name: "never ran, and the one before it collected", previous: "p2", by: map[string]allocs.Prior{"p2": never(there, "p1")}, wantErr: "no longer known to Nomad", wantReads: 2},
		{name: "never ran, nor any before it", previous: "p2", by: map[string]allocs.Prior{"p2": never(there, "p1"), "p1": never(here, "")}, wantReads: 2},
		{name: "a read fails", previous: "p1", err: errors.New("503"), wantErr: "503", wantReads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asker := record.Owner{AllocID: "asker", Namespace: "default", Job: "db", Group: "g", Task: "t", AllocName: "db.g[0]"}
			v := &allocs.View{NodeID: here, Allocs: map[string]allocs.Alloc{"asker": {Owner: asker, Previous: tc.previous}}}
			n := &priors{by: tc.by, err: tc.err}
			got, err := awaited(context.Background(), n, v, class, asker)
			if tc.wantErr != "" {
				must.Error(t, err)
				must.StrContains(t, err.Error(), "replaced")
				must.StrContains(t, err.Error(), tc.wantErr)
			} else {
				must.NoError(t, err)
			}
			must.Eq(t, tc.want, got)
			must.EqOp(t, tc.wantReads, n.reads)
		})
	}
	t.Run("a chain longer than the bound", func(t *testing.T) {
		by := map[string]allocs.Prior{}
		for i := range 20 {
			by[string(rune('a'+i))] = never(there, string(rune('a'+i+1)))
		}
		asker := record.Owner{AllocID: "asker", Namespace: "default", Task: "t"}
		v := &allocs.View{NodeID: here, Allocs: map[string]allocs.Alloc{"asker": {Owner: asker, Previous: "a"}}}
		n := &priors{by: by}
		got, err := awaited(context.Background(), n, v, class, asker)
		must.ErrorContains(t, err, "never ran")
		must.Eq(t, record.Awaited{}, got)
		must.EqOp(t, maxPriorHops, n.reads)
	})
}
