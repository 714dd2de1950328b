package periodic

// The scenario's jobs: a few periodic parent jobs whose cron never comes
// in the run, each run launched with Nomad's periodic force, as many at
// once as Options.InFlight lets.

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

const (
	// parentPrefix starts every parent job's ID: nightly-0, nightly-1...
	parentPrefix = "nightly-"
	// periodicSuffix joins a parent's ID and a run's launch time in the
	// run's job ID (Nomad's structs.PeriodicLaunchSuffix).
	periodicSuffix = "/periodic-"
	// farCron is the parents' schedule: 1 January 2099, so that no run but
	// the forced ones comes during the bench (a six-field spec ends with
	// the year).
	farCron = "0 0 1 1 * 2099"
	// pollPeriod spaces the reads of the runs' allocations.
	pollPeriod = 500 * time.Millisecond
	// sampleEvery is how many polls apart the archive is sampled.
	sampleEvery = 10
	// stallTimeout fails the churn when no run ends for this long.
	stallTimeout = 4 * time.Minute
)

// Child is one run of a parent job: the child job Nomad made at a force.
type Child struct {
	Job      string    `json:"job"` // the child's ID, <parent>/periodic-<unix time>
	Parent   string    `json:"parent"`
	Forced   time.Time `json:"forced"`
	AllocID  string    `json:"alloc_id,omitempty"`
	Status   string    `json:"status,omitempty"` // the allocation's client status
	Terminal time.Time `json:"terminal,omitzero"`
}

// parentJob is periodic parent job id: one task that writes mib MiB of
// random data into its slot of the class and ends. Its runs never restart
// nor reschedule, and may overlap (a force runs whatever runs already).
func parentJob(id string, mib int) *api.Job {
	script := fmt.Sprintf(`dd if=/dev/urandom of="$ZFS_STATE_PATH/data" bs=1048576 count=%d conv=fsync`, mib)
	res := &api.Resources{CPU: new(100), MemoryMB: new(32),
		Devices: []*api.RequestedDevice{{Name: "zfs/dataset/" + class, Count: new(uint64(1))}}}
	task := api.NewTask("t", "exec").SetConfig("command", "/bin/sh").SetConfig("args", []string{"-c", script}).Require(res)
	task.Env = map[string]string{"PATH": "/bin"} // the chroot holds /bin/sh and /bin/dd
	tg := api.NewTaskGroup("g", 1).AddTask(task)
	tg.RestartPolicy = &api.RestartPolicy{Attempts: new(0), Mode: new("fail")}
	tg.ReschedulePolicy = &api.ReschedulePolicy{Attempts: new(0), Unlimited: new(false)}
	job := api.NewBatchJob(id, id, "global", 50).AddTaskGroup(tg)
	job.Datacenters = []string{"*"}
	job.Periodic = &api.PeriodicConfig{Enabled: new(true), Spec: new(farCron), SpecType: new(api.PeriodicSpecCron),
		ProhibitOverlap: new(false)}
	return job
}

// parentOf returns the parent job of a run's job ID ("" for another ID).
func parentOf(job string) string {
	p, _, ok := strings.Cut(job, periodicSuffix)
	if !ok || !strings.HasPrefix(p, parentPrefix) {
		return ""
	}
	return p
}

func parentID(i int) string { return fmt.Sprintf("%s%d", parentPrefix, i) }

func (r *periodicRun) registerParents() error {
	for i := range r.o.Parents {
		if _, _, err := r.a.API.Jobs().Register(parentJob(parentID(i), r.o.DataMiB), nil); err != nil {
			return fmt.Errorf("registering periodic job %s: %w", parentID(i), err)
		}
	}
	return nil
}

// waitDevices returns once the node offers every slot of the class,
// healthy.
func (r *periodicRun) waitDevices(ctx context.Context) error {
	deadline := time.Now().Add(devicesTimeout)
	status := "no node read yet"
	for {
		node, _, err := r.a.API.Nodes().Info(r.a.NodeID, nil)
		if err == nil {
			healthy := 0
			if node.NodeResources != nil {
				for _, g := range node.NodeResources.Devices {
					if g.Vendor == "zfs" && g.Type == "dataset" && g.Name == class {
						for _, in := range g.Instances {
							if in.Healthy {
								healthy++
							}
						}
					}
				}
			}
			if healthy == r.o.Slots {
				return nil
			}
			status = fmt.Sprintf("%d of %d slots healthy", healthy, r.o.Slots)
		} else {
			status = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the node does not offer the class's slots after %s: %s", devicesTimeout, status)
		}
		if err := sleep(ctx, pollPeriod); err != nil {
			return err
		}
	}
}

// churn forces runs of the parents in turn, keeping at most InFlight
// forced and not yet ended, until Jobs runs have ended. Nomad names a run
// by its parent and its launch time in seconds, so one parent is forced at
// most once a second: a second force in the same second would name the
// same job.
func (r *periodicRun) churn(ctx context.Context) error {
	runs := map[string]*Child{}
	var order []*Child
	last := make([]int64, r.o.Parents) // the Unix second of each parent's last force
	next, ended, polls := 0, 0, 0
	progress := time.Now()
	q := &api.QueryOptions{Filter: fmt.Sprintf("JobID matches %q", "^"+regexp.QuoteMeta(parentPrefix)),
		Params: map[string]string{"task_states": "false"}}
	r.logf("%d runs of %d periodic jobs, at most %d forced and not ended at once", r.o.Jobs, r.o.Parents, r.o.InFlight)
	for ended < r.o.Jobs {
		stubs, _, err := r.a.API.Allocations().List(q)
		if err != nil {
			return fmt.Errorf("listing the runs' allocations: %w", err)
		}
		n := 0
		for _, s := range stubs {
			run := runs[s.JobID]
			if run == nil || !terminal(s.ClientStatus) || !run.Terminal.IsZero() {
				continue
			}
			run.AllocID, run.Status, run.Terminal = s.ID, s.ClientStatus, time.Unix(0, s.ModifyTime)
			n++
		}
		if n > 0 {
			ended += n
			progress = time.Now()
			if ended%20 == 0 || ended == r.o.Jobs {
				r.logf("%d of %d runs ended", ended, r.o.Jobs)
			}
		}
		for len(order)-ended < r.o.InFlight && len(order) < r.o.Jobs {
			p := r.nextParent(next, last)
			if p < 0 {
				break // every parent was forced this second
			}
			run, err := r.force(p, runs)
			if err != nil {
				return err
			}
			last[p], next = run.Forced.Unix(), p+1
			runs[run.Job] = run
			order = append(order, run)
		}
		if polls%sampleEvery == 0 {
			r.sampleArchive(ctx)
		}
		polls++
		if time.Since(progress) > stallTimeout {
			return fmt.Errorf("no run ended for %s: %d of %d ended, %d forced (agent log %s)", stallTimeout, ended, r.o.Jobs, len(order), r.a.LogPath)
		}
		if err := sleep(ctx, pollPeriod); err != nil {
			return err
		}
	}
	r.res.Runs = make([]Child, 0, len(order))
	var end time.Time
	for _, run := range order {
		r.res.Runs = append(r.res.Runs, *run)
		if run.Terminal.After(end) {
			end = run.Terminal
		}
		if run.Status != api.AllocClientStatusComplete {
			r.res.Failed++
		}
	}
	sort.SliceStable(r.res.Runs, func(i, j int) bool { return r.res.Runs[i].Forced.Before(r.res.Runs[j].Forced) })
	r.res.ChurnSeconds = end.Sub(order[0].Forced).Seconds()
	r.res.JobsPerSecond = float64(len(order)) / r.res.ChurnSeconds
	r.logf("%d runs in %.1f s: %.2f runs/s, %d did not complete", len(order), r.res.ChurnSeconds, r.res.JobsPerSecond, r.res.Failed)
	if r.res.Failed > 0 {
		r.violate("%d of %d runs did not complete (their allocations are in the JSON; the agent log has why)", r.res.Failed, len(order))
	}
	return nil
}

// nextParent returns the first parent from from on, in turn, not forced
// yet in this second; -1 when there is none.
func (r *periodicRun) nextParent(from int, last []int64) int {
	now := time.Now().Unix()
	for i := range r.o.Parents {
		p := (from + i) % r.o.Parents
		if last[p] < now {
			return p
		}
	}
	return -1
}

// force launches a run of parent p and returns it, named as Nomad named
// its job (read from the force's evaluation). A name seen before is an
// error: the force did not make a new run.
func (r *periodicRun) force(p int, seen map[string]*Child) (*Child, error) {
	id := parentID(p)
	forced := time.Now()
	evalID, _, err := r.a.API.Jobs().PeriodicForce(id, nil)
	if err != nil {
		return nil, fmt.Errorf("periodic force of %s: %w", id, err)
	}
	ev, _, err := r.a.API.Evaluations().Info(evalID, nil)
	if err != nil {
		return nil, fmt.Errorf("the evaluation of a force of %s: %w", id, err)
	}
	if parentOf(ev.JobID) != id {
		return nil, fmt.Errorf("a force of %s made job %q, not a run of it", id, ev.JobID)
	}
	if seen[ev.JobID] != nil {
		return nil, fmt.Errorf("a force of %s made job %q again: no new run", id, ev.JobID)
	}
	return &Child{Job: ev.JobID, Parent: id, Forced: forced}, nil
}

// terminal reports whether an allocation's client status is final.
func terminal(status string) bool {
	switch status {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return true
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
