package churn

// The churn's jobs, and what is recorded of their allocations.

import (
	"sort"
	"time"

	"github.com/hashicorp/nomad/api"
)

// The kinds of batch, and of job: without a device, with a slot of the
// plugin's class, with the null device plugin's device (null.go).
const (
	kindBaseline = "baseline"
	kindDevice   = "device"
	kindNull     = "null"
	// kindFloor is a null device job whose device is a ZFS dataset made
	// for it and destroyed at its end (floor.go).
	kindFloor = "floor"
)

// churnJob is one short batch job of kind (kindBaseline, kindDevice or
// kindNull); with a device it writes into it, at the same path and through
// the same variable whichever plugin gives it, and fails when it cannot.
func churnJob(id, kind string) *api.Job {
	script, res := "sleep 1", &api.Resources{CPU: ptr(churnTaskCPU), MemoryMB: ptr(32)}
	device := map[string]string{kindDevice: "zfs/dataset/" + churnClass, kindNull: nullDevice, kindFloor: nullDevice}[kind]
	if device != "" {
		script = `echo x > "$ZFS_SCRATCH_PATH/f" && sleep 1`
		res.Devices = []*api.RequestedDevice{{Name: device, Count: ptr(uint64(1))}}
	}
	task := api.NewTask("t", "exec").SetConfig("command", "/bin/sh").SetConfig("args", []string{"-c", script}).Require(res)
	task.Env = map[string]string{"PATH": "/bin"} // the chroot holds /bin/sh and /bin/sleep (localagent.ChrootEnv)
	tg := api.NewTaskGroup("g", 1).AddTask(task)
	tg.RestartPolicy = &api.RestartPolicy{Attempts: ptr(0), Mode: ptr("fail")}
	tg.ReschedulePolicy = &api.ReschedulePolicy{Attempts: ptr(0), Unlimited: ptr(false)}
	job := api.NewBatchJob(id, id, "global", 50).AddTaskGroup(tg)
	job.Datacenters = []string{"*"}
	return job
}

func ptr[T any](v T) *T { return &v }

// allocRecord summarizes a terminal allocation of one task.
func allocRecord(a *api.Allocation) AllocRecord {
	rec := AllocRecord{Job: a.JobID, AllocID: a.ID, Status: a.ClientStatus, Terminal: time.Unix(0, a.ModifyTime)}
	if a.CreateTime > 0 {
		rec.Placed = time.Unix(0, a.CreateTime)
	}
	if a.AllocatedResources != nil {
		for _, tr := range a.AllocatedResources.Tasks {
			for _, d := range tr.Devices {
				if len(d.DeviceIDs) > 0 {
					rec.Device = d.DeviceIDs[0]
				}
			}
		}
	}
	for _, ts := range a.TaskStates {
		rec.Started, rec.Finished = ts.StartedAt, ts.FinishedAt
		for _, ev := range ts.Events {
			if ev.Type == api.TaskTerminated {
				rec.Terminated = time.Unix(0, ev.Time)
			}
		}
	}
	return rec
}

// maxConcurrent is the most tasks that ran at once.
func maxConcurrent(allocs []AllocRecord) int {
	type edge struct {
		at time.Time
		d  int
	}
	var es []edge
	for _, a := range allocs {
		if !a.Started.IsZero() && !a.Finished.IsZero() {
			es = append(es, edge{a.Started, 1}, edge{a.Finished, -1})
		}
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].at.Equal(es[j].at) {
			return es[i].d < es[j].d
		}
		return es[i].at.Before(es[j].at)
	})
	cur, top := 0, 0
	for _, e := range es {
		cur += e.d
		top = max(top, cur)
	}
	return top
}
