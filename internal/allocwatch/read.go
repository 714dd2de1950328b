package allocwatch

// One read of the node's allocations: the request, and the allocations'
// fields the plugin keeps.

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/hashicorp/nomad/api"
)

// read does one (blocking when waitIndex > 0) read of the node's
// allocations.
func (w *Watcher) read(ctx context.Context, waitIndex uint64) (*Snapshot, error) {
	if err := w.refreshToken(); err != nil {
		return nil, err
	}
	nodeID, err := w.NodeID(ctx)
	if err != nil {
		return nil, err
	}
	deadline := callTimeout
	if waitIndex > 0 {
		deadline = blockingDeadline
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	began := time.Now()
	// The context mark has leanAnswers decode the answer as it streams in.
	q := (&api.QueryOptions{WaitIndex: waitIndex, WaitTime: blockingWait}).WithContext(context.WithValue(ctx, leanList{}, true))
	var allocs []*leanAlloc
	meta, err := w.client.Raw().Query("/v1/node/"+url.PathEscape(nodeID)+"/allocations", &allocs, q)
	if err != nil {
		err = fmt.Errorf("GET /v1/node/%s/allocations: %w", nodeID, classify(err))
		w.readFailed(CallNodeAllocations, err)
		return nil, err
	}
	snap := &Snapshot{Allocs: make(map[string]*Alloc, len(allocs)), Began: began, At: time.Now()}
	if meta != nil {
		snap.Index = meta.LastIndex
	}
	for _, a := range allocs {
		if a == nil || a.ID == "" {
			continue
		}
		snap.Allocs[a.ID] = convert(a)
	}
	// took: the request, the agent's answer and its decoding.
	w.log.Trace("read the node's allocations", "blocking", waitIndex > 0, "allocs", len(allocs), "index", snap.Index, "took", snap.At.Sub(began))
	return snap, nil
}

// leanAlloc is the part of an allocation in /v1/node/:id/allocations that
// the watcher uses. The answer is read at the changes of any allocation
// on the node, and every allocation in it carries its job: leanAnswers
// decodes it one allocation at a time into these fields as it streams in.
type leanAlloc struct {
	ID, Namespace, JobID, TaskGroup, Name string
	ClientStatus, DesiredStatus           string
	// PreviousAllocation is the allocation this one replaced (rescheduled,
	// migrated, or updated destructively); "" for none.
	PreviousAllocation string
	// Job is kept only for its parent: the job that launched a periodic
	// or dispatched child.
	Job *struct {
		ParentID string
	}
	AllocatedResources *struct {
		Tasks map[string]*struct {
			Devices []*struct {
				Vendor, Type string
				DeviceIDs    []string
			}
		}
	}
	TaskStates map[string]*struct {
		State     string
		StartedAt time.Time
	}
}

func convert(a *leanAlloc) *Alloc {
	out := &Alloc{
		ID: a.ID, Namespace: a.Namespace, JobID: a.JobID, TaskGroup: a.TaskGroup, Name: a.Name,
		ClientStatus: a.ClientStatus, Devices: map[string]string{}, DeadTasks: map[string]bool{}, StartedTasks: map[string]bool{},
		Stopping: a.DesiredStatus == api.AllocDesiredStatusStop || a.DesiredStatus == api.AllocDesiredStatusEvict,
		Previous: a.PreviousAllocation,
	}
	if a.Job != nil {
		out.ParentJobID = a.Job.ParentID
	}
	if a.AllocatedResources != nil {
		for task, tr := range a.AllocatedResources.Tasks {
			if tr == nil {
				continue
			}
			for _, d := range tr.Devices {
				if d == nil || d.Vendor != deviceVendor || d.Type != deviceType {
					continue
				}
				for _, id := range d.DeviceIDs {
					out.Devices[id] = task
				}
			}
		}
	}
	for task, ts := range a.TaskStates {
		if ts == nil {
			continue
		}
		if ts.State == "dead" {
			out.DeadTasks[task] = true
		}
		if ts.State == "running" || !ts.StartedAt.IsZero() {
			out.StartedTasks[task] = true
		}
	}
	return out
}
