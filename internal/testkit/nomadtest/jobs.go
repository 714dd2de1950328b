package nomadtest

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

// pollInterval is how often the wait helpers ask the API.
const pollInterval = 500 * time.Millisecond

// Wait polls fn until it reports done or timeout passes, then fails the test
// with what, the timeout, and the last status fn returned. It also fails at
// once when the agent exits.
func (a *Agent) Wait(t testing.TB, what string, timeout time.Duration, fn func() (done bool, status string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, status := fn()
		if done {
			return
		}
		if a.Exited() {
			t.Fatalf("nomad agent exited (%v) while waiting for %s; last status: %s", a.exitErr, what, status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last status: %s", timeout, what, status)
		}
		time.Sleep(pollInterval)
	}
}

// WaitForDevice waits until the agent's node has the device group
// vendor/typ/name with exactly healthy healthy instances, and returns it.
func (a *Agent) WaitForDevice(t testing.TB, vendor, typ, name string, healthy int, timeout time.Duration) *api.NodeDeviceResource {
	t.Helper()
	id := vendor + "/" + typ + "/" + name
	var found *api.NodeDeviceResource
	a.Wait(t, fmt.Sprintf("device %s with %d healthy instances", id, healthy), timeout, func() (bool, string) {
		node, _, err := a.API.Nodes().Info(a.NodeID, nil)
		if err != nil {
			return false, err.Error()
		}
		if node.NodeResources == nil {
			return false, "node has no resources yet"
		}
		for _, d := range node.NodeResources.Devices {
			if d.Vendor == vendor && d.Type == typ && d.Name == name {
				n := 0
				for _, inst := range d.Instances {
					if inst.Healthy {
						n++
					}
				}
				if n == healthy {
					found = d
					return true, ""
				}
				return false, fmt.Sprintf("%d healthy: %s", n, DescribeDevices(node.NodeResources.Devices))
			}
		}
		return false, "node devices: " + DescribeDevices(node.NodeResources.Devices)
	})
	return found
}

// DescribeDevices renders device groups for messages: each group's ID, then
// its instances with health.
func DescribeDevices(groups []*api.NodeDeviceResource) string {
	if len(groups) == 0 {
		return "(none)"
	}
	var parts []string
	for _, g := range groups {
		var inst []string
		for _, d := range g.Instances {
			s := d.ID + "=healthy"
			if !d.Healthy {
				s = fmt.Sprintf("%s=unhealthy(%s)", d.ID, d.HealthDescription)
			}
			inst = append(inst, s)
		}
		parts = append(parts, fmt.Sprintf("%s[%s]", g.ID(), strings.Join(inst, " ")))
	}
	return strings.Join(parts, "; ")
}

// RunJob registers jobHCL (RegisterJob) and waits until its first
// allocation reaches a terminal client status (complete, failed or lost),
// which it returns. When the status is not complete it logs the task events
// and the stderr and stdout logs; the caller asserts the status. It fails
// the test when the job cannot be placed or nothing terminal happens within
// timeout.
func (a *Agent) RunJob(t testing.TB, jobHCL string, timeout time.Duration) *api.Allocation {
	t.Helper()
	job := a.RegisterJob(t, jobHCL)
	alloc := a.WaitForAlloc(t, job, "a terminal client status", timeout, (*api.Allocation).ClientTerminalStatus)
	t.Logf("job %s: alloc %s %s", job.ID, alloc.ID, alloc.ClientStatus)
	if alloc.ClientStatus != api.AllocClientStatusComplete {
		a.LogAlloc(t, alloc)
	}
	return alloc
}

// Job is a job registered by RegisterJob.
type Job struct {
	ID     string
	EvalID string
}

// RegisterJob parses jobHCL with the agent (Jobs().ParseHCL) and registers
// it. The job is deregistered when the test ends.
func (a *Agent) RegisterJob(t testing.TB, jobHCL string) Job {
	t.Helper()
	job, err := a.API.Jobs().ParseHCL(jobHCL, true)
	must.NoError(t, err, must.Sprint("parsing the job HCL with the agent"))
	resp, _, err := a.API.Jobs().Register(job, nil)
	must.NoError(t, err, must.Sprintf("registering job %s", *job.ID))
	jobID := *job.ID
	t.Cleanup(func() {
		if !a.Exited() {
			_, _, _ = a.API.Jobs().Deregister(jobID, false, nil)
		}
	})
	return Job{ID: jobID, EvalID: resp.EvalID}
}

// StopJob deregisters the job and waits until Nomad has evaluated the
// deregistration and every allocation of the job is client-terminal, so
// that a test can tell Nomad not stopping a task from the plugin not
// releasing its device. It logs how long the stop took. On a timeout it
// fails the test naming the allocations not stopped, and logs the job's
// evaluations (status, trigger, description), read once then rather than
// at every poll, so that the agent log's tail is not filled with the
// wait's own requests.
func (a *Agent) StopJob(t testing.TB, jobID string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	evalID, _, err := a.API.Jobs().Deregister(jobID, false, nil)
	must.NoError(t, err, must.Sprintf("deregistering job %s", jobID))
	stopped := false
	defer func() {
		if !stopped {
			t.Logf("evaluations of job %s (the deregistration's is %s): %s", jobID, evalID, a.describeEvals(jobID))
		}
	}()
	a.Wait(t, fmt.Sprintf("job %s to stop (deregistration eval %s)", jobID, evalID), timeout, func() (bool, string) {
		stubs, _, err := a.API.Jobs().Allocations(jobID, true, nil)
		if err != nil {
			return false, err.Error()
		}
		var live []string
		for _, s := range stubs {
			// A stub has no ClientTerminalStatus of its own: ask Nomad's.
			if !(&api.Allocation{ClientStatus: s.ClientStatus}).ClientTerminalStatus() {
				live = append(live, fmt.Sprintf("%s %s (desired %s)", s.ID, s.ClientStatus, s.DesiredStatus))
			}
		}
		if len(live) > 0 {
			sort.Strings(live)
			return false, "allocations not stopped: " + strings.Join(live, ", ")
		}
		// Every allocation has ended; the deregistration is done once its
		// evaluation is (a job not placed yet has no allocation to wait on).
		eval, _, err := a.API.Evaluations().Info(evalID, nil)
		if err != nil {
			return false, fmt.Sprintf("eval %s: %v", evalID, err)
		}
		return eval.Status == api.EvalStatusComplete, fmt.Sprintf("every allocation stopped; eval %s is %s", evalID, eval.Status)
	})
	stopped = true
	t.Logf("job %s stopped in %s", jobID, time.Since(start).Round(time.Millisecond))
}

// describeEvals renders a job's evaluations, oldest first, for messages.
func (a *Agent) describeEvals(jobID string) string {
	evals, _, err := a.API.Jobs().Evaluations(jobID, nil)
	if err != nil {
		return err.Error()
	}
	sort.Slice(evals, func(i, j int) bool { return evals[i].CreateIndex < evals[j].CreateIndex })
	var parts []string
	for _, e := range evals {
		s := fmt.Sprintf("%s %s by %s", e.ID, e.Status, e.TriggeredBy)
		if e.StatusDescription != "" {
			s += fmt.Sprintf(" (%s)", e.StatusDescription)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ", ")
}

// WaitForAlloc waits until the job's first allocation satisfies cond (what
// describes it for messages), and returns the allocation. It fails the test,
// logging the allocation's task events and logs, when the allocation reaches
// a terminal client status that does not satisfy cond, and when the job is
// not placed or cond does not hold within timeout.
func (a *Agent) WaitForAlloc(t testing.TB, job Job, what string, timeout time.Duration, cond func(*api.Allocation) bool) *api.Allocation {
	t.Helper()
	var alloc *api.Allocation
	var stuck bool
	// On a timeout (t.Fatalf in Wait), show what the allocation went through.
	defer func() {
		if t.Failed() && !stuck && alloc != nil && alloc.JobID != "" {
			a.LogAlloc(t, alloc)
		}
	}()
	a.Wait(t, fmt.Sprintf("the allocation of job %s to reach %s", job.ID, what), timeout, func() (bool, string) {
		if alloc == nil {
			stubs, _, err := a.API.Jobs().Allocations(job.ID, true, nil)
			if err != nil {
				return false, err.Error()
			}
			if len(stubs) == 0 {
				return false, a.placementStatus(job.EvalID)
			}
			sort.Slice(stubs, func(i, j int) bool { return stubs[i].CreateIndex < stubs[j].CreateIndex })
			alloc = &api.Allocation{ID: stubs[0].ID}
		}
		info, _, err := a.API.Allocations().Info(alloc.ID, nil)
		if err != nil {
			return false, err.Error()
		}
		alloc = info
		if cond(info) {
			return true, ""
		}
		if info.ClientTerminalStatus() {
			stuck = true
			return true, ""
		}
		return false, fmt.Sprintf("alloc %s is %s; %s", info.ID, info.ClientStatus, DescribeTaskStates(info))
	})
	if stuck {
		a.LogAlloc(t, alloc)
		t.Fatalf("allocation %s of job %s ended %s without reaching %s", alloc.ID, job.ID, alloc.ClientStatus, what)
	}
	return alloc
}

// placementStatus describes an evaluation that has placed nothing yet.
func (a *Agent) placementStatus(evalID string) string {
	eval, _, err := a.API.Evaluations().Info(evalID, nil)
	if err != nil {
		return fmt.Sprintf("no allocation; eval %s: %v", evalID, err)
	}
	s := fmt.Sprintf("no allocation; eval %s is %s", evalID, eval.Status)
	for tg, m := range eval.FailedTGAllocs {
		s += fmt.Sprintf("; group %q failed placement: %d nodes evaluated, filtered by constraint %v, by class %v, exhausted dimensions %v",
			tg, m.NodesEvaluated, m.ConstraintFiltered, m.ClassFiltered, m.DimensionExhausted)
	}
	if eval.BlockedEval != "" {
		s += "; blocked eval " + eval.BlockedEval
	}
	return s
}

// DescribeTaskStates renders each task's state and events on one line.
func DescribeTaskStates(alloc *api.Allocation) string {
	var names []string
	for name := range alloc.TaskStates {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		ts := alloc.TaskStates[name]
		var evs []string
		for _, ev := range ts.Events {
			msg := ev.DisplayMessage
			if msg == "" {
				msg = ev.Message
			}
			evs = append(evs, fmt.Sprintf("%s: %s", ev.Type, msg))
		}
		parts = append(parts, fmt.Sprintf("task %s %s (failed=%v) [%s]", name, ts.State, ts.Failed, strings.Join(evs, " | ")))
	}
	if len(parts) == 0 {
		return "no task states yet"
	}
	return strings.Join(parts, "; ")
}

// LogAlloc logs an allocation's status, task events and, per task, the
// stderr and stdout logs read through the API.
func (a *Agent) LogAlloc(t testing.TB, alloc *api.Allocation) {
	t.Helper()
	t.Logf("alloc %s: client status %s (%s), desired %s", alloc.ID, alloc.ClientStatus, alloc.ClientDescription, alloc.DesiredStatus)
	var names []string
	for name := range alloc.TaskStates {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ts := alloc.TaskStates[name]
		t.Logf("task %s: %s, failed=%v", name, ts.State, ts.Failed)
		for _, ev := range ts.Events {
			msg := ev.DisplayMessage
			if msg == "" {
				msg = ev.Message
			}
			t.Logf("  %s %s: %s %v", time.Unix(0, ev.Time).Format(time.TimeOnly), ev.Type, msg, ev.Details)
		}
		for _, typ := range []string{"stderr", "stdout"} {
			out, err := a.TaskLog(alloc, name, typ)
			if err != nil {
				t.Logf("task %s %s: %v", name, typ, err)
				continue
			}
			t.Logf("task %s %s:\n%s", name, typ, out)
		}
	}
}

// TaskLog reads a task's whole stdout or stderr (typ) through the API's
// logs endpoint.
func (a *Agent) TaskLog(alloc *api.Allocation, task, typ string) (string, error) {
	cancel := make(chan struct{})
	defer close(cancel)
	frames, errs := a.API.AllocFS().Logs(alloc, false, task, typ, api.OriginStart, 0, cancel, nil)
	var b strings.Builder
	timeout := time.After(30 * time.Second)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return b.String(), nil
			}
			if f != nil {
				b.Write(f.Data)
			}
		case err := <-errs:
			if err != nil {
				return b.String(), err
			}
		case <-timeout:
			return b.String(), fmt.Errorf("reading %s of task %s: timed out", typ, task)
		}
	}
}

// JobSpec describes a test job of one group "g" whose tasks never restart
// and which is never rescheduled unless Reschedule says so; HCL renders it
// for RegisterJob and RunJob.
type JobSpec struct {
	ID         string // the job's ID and name
	Namespace  string // "" leaves the job in the default namespace
	Type       string // "batch" when ""
	Reschedule bool   // keep Nomad's reschedule policy for the type
	// Parameterized: a parameterized job, run by dispatch (each dispatch
	// a new job whose parent is this one).
	Parameterized bool
	Meta          map[string]string // the job's meta, rendered in key order
	Constraints   []Constraint      // the group's constraints
	Tasks         []TaskSpec        // the group's tasks, in order
}

// TaskSpec is one task of a JobSpec: Script run by /bin/sh -c, with the
// resources cpu 100 and Memory, and one instance of Device when it names
// one.
type TaskSpec struct {
	Name              string
	Driver            string // "exec" when ""
	Poststop          bool   // a poststop lifecycle task
	KillTimeout       string // "" keeps Nomad's default
	Artifact          string // a URL fetched into local/ before the task starts ("" none)
	Script            string // the shell script, as the shell gets it
	Memory            int    // MiB; 32 when 0
	Device            string // the device asked for, such as "zfs/dataset/scratch" ("" none)
	DeviceConstraints []Constraint
}

// Constraint is a constraint block: attribute (such as
// "${node.unique.id}", left for Nomad to interpret) equal to value, or in
// the relation Operator names (such as "set_contains"; "" for equal).
type Constraint struct {
	Attribute, Value string
	Operator         string
}

// HCL renders the job. A one-line script goes in a quoted string, any
// other in a heredoc (which ends it with a newline), with HCL's template
// sequences ("${", "%{") escaped, so that the task's args hold Script as
// written (a script must hold no line "EOT"; Nomad still interpolates its
// runtime variables, such as ${NOMAD_ALLOC_ID}, in args when the task
// starts).
func (j JobSpec) HCL() string {
	var b strings.Builder
	w := func(indent int, format string, args ...any) {
		b.WriteString(strings.Repeat("  ", indent))
		fmt.Fprintf(&b, format, args...)
		b.WriteByte('\n')
	}
	typ := j.Type
	if typ == "" {
		typ = "batch"
	}
	w(0, "job %q {", j.ID)
	if j.Namespace != "" {
		w(1, "namespace = %q", j.Namespace)
	}
	w(1, "type = %q", typ)
	if j.Parameterized {
		w(1, "parameterized {}")
	}
	if len(j.Meta) > 0 {
		keys := make([]string, 0, len(j.Meta))
		for k := range j.Meta {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		w(1, "meta {")
		for _, k := range keys {
			w(2, "%s = %q", k, j.Meta[k])
		}
		w(1, "}")
	}
	w(1, `group "g" {`)
	writeConstraints(w, 2, j.Constraints)
	w(2, "restart {")
	w(3, "attempts = 0")
	w(3, `mode     = "fail"`)
	w(2, "}")
	if !j.Reschedule {
		w(2, "reschedule {")
		w(3, "attempts  = 0")
		w(3, "unlimited = false")
		w(2, "}")
	}
	for _, task := range j.Tasks {
		task.write(w)
	}
	w(1, "}")
	w(0, "}")
	return b.String()
}

// write renders the task block at depth 2.
func (task TaskSpec) write(w func(indent int, format string, args ...any)) {
	driver, memory := task.Driver, task.Memory
	if driver == "" {
		driver = "exec"
	}
	if memory == 0 {
		memory = 32
	}
	w(2, "task %q {", task.Name)
	if task.Poststop {
		w(3, "lifecycle {")
		w(4, `hook = "poststop"`)
		w(3, "}")
	}
	w(3, "driver = %q", driver)
	if task.KillTimeout != "" {
		w(3, "kill_timeout = %q", task.KillTimeout)
	}
	if task.Artifact != "" {
		w(3, "artifact {")
		w(4, "source      = %q", task.Artifact)
		w(4, `destination = "local/"`)
		w(3, "}")
	}
	w(3, "config {")
	w(4, `command = "/bin/sh"`)
	script := strings.NewReplacer("${", "$${", "%{", "%%{").Replace(task.Script)
	if !strings.Contains(script, "\n") {
		w(4, `args    = ["-c", "%s"]`, strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\t", `\t`, "\r", `\r`).Replace(script))
	} else {
		w(4, `args = ["-c", <<-EOT`)
		for _, line := range strings.Split(strings.TrimSuffix(script, "\n"), "\n") {
			w(5, "%s", line)
		}
		w(5, "EOT")
		w(4, "]")
	}
	w(3, "}")
	w(3, "resources {")
	w(4, "cpu    = 100")
	w(4, "memory = %d", memory)
	if task.Device != "" {
		w(4, "device %q {", task.Device)
		w(5, "count = 1")
		writeConstraints(w, 5, task.DeviceConstraints)
		w(4, "}")
	}
	w(3, "}")
	w(2, "}")
}

// writeConstraints renders constraint blocks at depth indent.
func writeConstraints(w func(indent int, format string, args ...any), indent int, cs []Constraint) {
	for _, c := range cs {
		w(indent, "constraint {")
		w(indent+1, "attribute = %q", c.Attribute)
		if c.Operator != "" {
			w(indent+1, "operator  = %q", c.Operator)
		}
		w(indent+1, "value     = %q", c.Value)
		w(indent, "}")
	}
}
