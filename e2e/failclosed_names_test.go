package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// namesTenantHCL is a tenant whose job ID, group and task names the test
// replaces after parsing (HCL cannot carry a TAB or a newline in a label).
// It writes its allocation ID into hello.txt, then, when hold is set, waits
// (bounded) for release-me from the host before it exits.
func namesTenantHCL(hold bool) string {
	h := map[bool]string{false: "0", true: "1"}[hold]
	return nomadtest.JobSpec{ID: "names-tenant", Tasks: []nomadtest.TaskSpec{{
		Name: "t", Device: "zfs/dataset/scratch",
		Script: `set -eu
echo "$NOMAD_ALLOC_ID" > "$ZFS_SCRATCH_PATH/hello.txt"
sync
i=0
while [ ` + h + ` = 1 ] && [ ! -e "$ZFS_SCRATCH_PATH/release-me" ]; do
  i=$((i + 1))
  if [ "$i" -gt 300 ]; then echo "no release-me after 300 s" >&2; exit 1; fi
  sleep 1
done
echo done
`,
	}}}.HCL()
}

// namesPluginConfig is the plugin block of these tests: short periods and
// reserve_timeout, one class "scratch" of n slots.
func namesPluginConfig(parent string, n int) string {
	return fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "2s"
    reserve_timeout    = "10s"
    class "scratch" {
      slots = %d
      quota = "32M"
    }
  }
}
`, parent, n)
}

// namesRegister registers the tenant with the given job ID (also its
// name), group and task names, and deregisters it when the test ends.
func namesRegister(t *testing.T, agent *nomadtest.Agent, jobID, group, task string, hold bool) nomadtest.Job {
	t.Helper()
	job, err := agent.API.Jobs().ParseHCL(namesTenantHCL(hold), true)
	must.NoError(t, err)
	job.ID, job.Name = &jobID, &jobID
	job.TaskGroups[0].Name = &group
	job.TaskGroups[0].Tasks[0].Name = task
	resp, _, err := agent.API.Jobs().Register(job, nil)
	must.NoError(t, err, must.Sprintf("registering job %q (group %q, task %q)", jobID, group, task))
	t.Cleanup(func() {
		if !agent.Exited() {
			_, _, _ = agent.API.Jobs().Deregister(jobID, false, nil)
		}
	})
	return nomadtest.Job{ID: jobID, EvalID: resp.EvalID}
}

// namesDeviceOf returns the device ID the allocation's task holds.
func namesDeviceOf(t *testing.T, alloc *api.Allocation, task string) string {
	t.Helper()
	must.NotNil(t, alloc.AllocatedResources)
	tr := alloc.AllocatedResources.Tasks[task]
	must.NotNil(t, tr, must.Sprintf("no resources for task %q", task))
	must.SliceLen(t, 1, tr.Devices)
	must.SliceLen(t, 1, tr.Devices[0].DeviceIDs)
	return tr.Devices[0].DeviceIDs[0]
}

// namesRaw returns a property's value exactly as zfs prints it (one
// trailing newline removed), not through the plugin's parser.
func namesRaw(t *testing.T, pool *zfstest.Pool, ds, prop string) string {
	t.Helper()
	return strings.TrimSuffix(pool.ZFS(t, "get", "-H", "-o", "value", prop, ds), "\n")
}

// namesControl reports whether s holds a control character.
func namesControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// namesHealth watches the node's zfs/dataset/scratch instances once a
// second from start until stop, and records every unhealthy state seen
// per instance ID.
type namesHealth struct {
	mu        sync.Mutex
	unhealthy map[string][]string
	polls     int
	done      chan struct{}
	stopped   sync.Once
	wg        sync.WaitGroup
}

func namesWatchHealth(t *testing.T, agent *nomadtest.Agent) *namesHealth {
	t.Helper()
	h := &namesHealth{unhealthy: map[string][]string{}, done: make(chan struct{})}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			q := (&api.QueryOptions{}).WithContext(t.Context())
			if node, _, err := agent.API.Nodes().Info(agent.NodeID, q); err == nil && node.NodeResources != nil {
				h.mu.Lock()
				h.polls++
				for _, d := range node.NodeResources.Devices {
					if d.Vendor != "zfs" || d.Type != "dataset" || d.Name != "scratch" {
						continue
					}
					for _, inst := range d.Instances {
						// A slot being released is unhealthy by design:
						// only other reasons count.
						if !inst.Healthy && !strings.HasPrefix(inst.HealthDescription, "releasing: ") {
							h.unhealthy[inst.ID] = append(h.unhealthy[inst.ID], inst.HealthDescription)
						}
					}
				}
				h.mu.Unlock()
			}
			select {
			case <-h.done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { h.stop() })
	return h
}

// stop ends the watch and returns the unhealthy states seen per instance
// and the number of successful polls.
func (h *namesHealth) stop() (map[string][]string, int) {
	h.stopped.Do(func() { close(h.done) })
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.unhealthy, h.polls
}

// TestFailClosed_ControlCharactersInNames: a TAB and a newline in the job
// ID and the group name, a TAB in the task name (Nomad's validation refuses
// only spaces and NUL in a job ID, NUL in names and slashes in task names;
// a newline in a task name passes it but breaks the exec driver) reach the
// plugin, which records them encoded: the owner decodes to the
// raw names, ZFS holds no control character, the other slot stays healthy
// all along, the slot is archived under a clean name and comes back fresh.
// Then datasets carrying legacy owner properties with raw control
// characters (as an earlier version wrote) keep the node healthy, and the
// plugin rewrites those that broke its batched read.
func TestFailClosed_ControlCharactersInNames(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	archive := parent + "/.archive"
	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir:    filepath.Dir(pluginBin),
		PluginConfig: namesPluginConfig(parent, 2),
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	step("agent up, 2 healthy slots")

	const (
		jobID = "names\tjob\nid"
		group = "g\tgroup\nname"
		// Nomad accepts a newline in a task name too, but the exec driver
		// then fails: the cgroup "<alloc>.<task>" cannot hold one (mkdir:
		// invalid argument).
		task = "t\ttask"
	)
	watch := namesWatchHealth(t, agent)
	job := namesRegister(t, agent, jobID, group, task, true)
	alloc := agent.WaitForAlloc(t, job, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	devID := namesDeviceOf(t, alloc, task)
	index := strings.TrimPrefix(devID, "scratch-")
	otherID := map[string]string{"0": "scratch-1", "1": "scratch-0"}[index]
	slot := parent + "/scratch/" + index // the first tenant's
	slotIdx, err := strconv.Atoi(index)
	must.NoError(t, err)
	mp := pool.Prop(t, slot, "mountpoint")
	step("alloc %s (%q) running on %s", alloc.ID[:8], alloc.Name, devID)

	// While it runs: the owner is recorded encoded, and decodes to the raw
	// names.
	agent.Wait(t, "hello.txt in "+slot, holdTimeout, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(mp, "hello.txt"))
		return err == nil && string(b) == alloc.ID+"\n", fmt.Sprintf("%q %v", b, err)
	})
	agent.Wait(t, "the owner recorded on "+slot, holdTimeout, func() (bool, string) {
		v := recordedOwner(t, pool, slot).AllocID
		return v == alloc.ID, "owner alloc ID=" + v
	})
	raw := namesRaw(t, pool, slot, record.PropOwner)
	must.False(t, namesControl(raw), must.Sprintf("raw %s of %s: %q", record.PropOwner, slot, raw))
	o := recordedOwner(t, pool, slot)
	must.Eq(t, record.Owner{AllocID: alloc.ID, Namespace: "default", Job: jobID, Group: group, Task: task,
		AllocName: alloc.Name, NodeID: agent.NodeID}, o)
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	step("owner recorded as %q, decodes to the raw names; both slots healthy", raw)

	// Let it end: the slot is archived under a clean name, with the owner.
	must.NoError(t, os.WriteFile(filepath.Join(mp, "release-me"), nil, 0o644))
	agent.WaitForAlloc(t, job, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	var archived string
	agent.Wait(t, "the release of "+slot, releaseTimeout, func() (bool, string) {
		archived = archivedFor(t, pool, archive, alloc.ID)
		state := pollState(pool, servingDataset(pool, parent, slotIdx))
		return archived != "" && state == "free", fmt.Sprintf("archive=%q slot state=%q", archived, state)
	})
	step("released into %q", archived)
	must.False(t, namesControl(archived), must.Sprintf("archive name %q", archived))
	must.StrHasPrefix(t, archive+"/"+devID+".default.names_job_id.g_group_name.t_task."+alloc.ID[:8]+".", archived)
	must.EqOp(t, "archived", stateOf(t, pool, archived))
	must.Eq(t, o, recordedOwner(t, pool, archived))
	dir, unmount := pool.Look(t, archived)
	b, err := os.ReadFile(filepath.Join(dir, "hello.txt"))
	must.NoError(t, err)
	must.EqOp(t, alloc.ID+"\n", string(b))
	unmount()
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)

	checker := agent.RunJob(t, checkerJob("checker"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, checker.ClientStatus)
	var checkerArchived string
	agent.Wait(t, "the checker's release", releaseTimeout, func() (bool, string) {
		checkerArchived = archivedFor(t, pool, archive, checker.ID)
		s0, s1 := pollState(pool, servingDataset(pool, parent, 0)), pollState(pool, servingDataset(pool, parent, 1))
		return checkerArchived != "" && s0 == "free" && s1 == "free", fmt.Sprintf("archive=%q states %s/%s", checkerArchived, s0, s1)
	})
	seen, polls := watch.stop()
	step("checker ran on a fresh slot; health polls %d, unhealthy seen: %q", polls, seen)
	must.Positive(t, polls)
	must.SliceEmpty(t, seen[otherID], must.Sprintf("the other slot %s must stay healthy", otherID))
	for id, descs := range seen {
		for _, d := range descs {
			must.False(t, namesControl(d), must.Sprintf("health text of %s: %q", id, d))
		}
	}

	// Part 2: legacy owner properties with raw control characters. A value
	// with a newline breaks the batched read of its dataset; the plugin
	// re-reads it exactly and rewrites every legacy owner property of that
	// dataset with the control characters replaced by '?'. A value with
	// TABs only parses exactly, so it is left as it is. The newline in
	// slot 0's value is followed by a forged record claiming slot 1 is
	// reserved: slot 1 must stay free and healthy.
	watch = namesWatchHealth(t, agent)
	slot0, slot1 := servingDataset(pool, parent, 0), servingDataset(pool, parent, 1)
	type legacy struct{ ds, prop, value, want string }
	cases := []legacy{
		{archived, "nomad-device-zfs:job", "legacy\tjob\nname", "legacy?job?name"},
		{archived, "nomad-device-zfs:group", "tab\tgroup", "tab?group"},
		{slot0, "nomad-device-zfs:task", "legacy\ntask\n" + slot1 + "\tnomad-device-zfs:state\treserved\tlocal", ""},
		{checkerArchived, "nomad-device-zfs:alloc-name", "tab\tonly", "tab\tonly"},
	}
	cases[2].want = strings.NewReplacer("\n", "?", "\t", "?").Replace(cases[2].value)
	for _, c := range cases {
		pool.ZFS(t, "set", c.prop+"="+c.value, c.ds)
	}
	step("legacy properties with control characters set")
	agent.Wait(t, "the legacy properties rewritten", releaseTimeout, func() (bool, string) {
		var bad []string
		for _, c := range cases {
			if v := namesRaw(t, pool, c.ds, c.prop); v != c.want {
				bad = append(bad, fmt.Sprintf("%s %s=%q", c.ds, c.prop, v))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	// Several more syncs: the node stays healthy, the forged line changed
	// nothing, and the archived owner still decodes.
	time.Sleep(6 * time.Second)
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	must.EqOp(t, "free", stateOf(t, pool, slot1), must.Sprint("the same dataset, free: the forged line changed nothing"))
	must.EqOp(t, "archived", stateOf(t, pool, archived))
	must.Eq(t, o, recordedOwner(t, pool, archived))
	seen, polls = watch.stop()
	step("legacy values handled; health polls %d, unhealthy seen: %q", polls, seen)
	must.Positive(t, polls)
	must.MapEmpty(t, seen, must.Sprintf("no slot may turn unhealthy over legacy values; agent log tail:\n%s", agent.LogTail(40)))

	checker2 := agent.RunJob(t, checkerJob("checker2"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, checker2.ClientStatus)
	step("a second checker ran on a fresh slot")
}

// TestFailClosed_LongNames: a parent dataset as long as the plugin accepts
// and a job ID, group and task name far longer than fit a dataset name
// together. The release still fits ZFS's 255 bytes (a shortened archive
// name), the full names stay in the owner property, the archived file is
// intact, and the slot comes back fresh.
func TestFailClosed_LongNames(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	// The longest parent SetConfig accepts (internal/device/config.go).
	maxParent := record.MaxNameLen - len("/"+record.ArchiveName+"/") - record.MinArchiveLeafLen
	head := pool.Name + "/" + strings.Repeat("p", 100) + "/"
	parent := head + strings.Repeat("q", maxParent-len(head))
	must.EqOp(t, maxParent, len(parent))
	pool.ZFS(t, "create", "-p", parent)
	archive := parent + "/.archive"
	slot, slotIdx := parent+"/scratch/0", 0
	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir:    filepath.Dir(pluginBin),
		PluginConfig: namesPluginConfig(parent, 1),
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	step("agent up with a %d-byte parent", len(parent))

	// Nomad bounds none of these; the task name becomes a file name
	// (".<task>.stdout.fifo" in the alloc's log dir, 255 bytes at most).
	jobID := "long-job-" + strings.Repeat("j", 231)
	group := "long-group-" + strings.Repeat("g", 229)
	task := "long-task-" + strings.Repeat("t", 190)
	job := namesRegister(t, agent, jobID, group, task, false)
	alloc := agent.WaitForAlloc(t, job, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	must.EqOp(t, "scratch-0", namesDeviceOf(t, alloc, task))
	step("alloc %s complete", alloc.ID[:8])

	var archived string
	agent.Wait(t, "the release of "+slot, releaseTimeout, func() (bool, string) {
		archived = archivedFor(t, pool, archive, alloc.ID)
		state := pollState(pool, servingDataset(pool, parent, slotIdx))
		return archived != "" && state == "free", fmt.Sprintf("archive=%q slot state=%q", archived, state)
	})
	step("released into %s (%d bytes)", archived, len(archived))
	must.LessEq(t, record.MaxNameLen, len(archived))
	must.StrHasPrefix(t, archive+"/scratch-0.h", archived)
	must.EqOp(t, "archived", stateOf(t, pool, archived))
	o := recordedOwner(t, pool, archived)
	must.EqOp(t, alloc.ID, o.AllocID)
	must.EqOp(t, jobID, o.Job)
	must.EqOp(t, group, o.Group)
	must.EqOp(t, task, o.Task)
	must.EqOp(t, agent.NodeID, o.NodeID)
	// The allocation name ("<job>.<group>[0]", 483 bytes) is cut to the
	// owner's field bound (256 bytes, internal/slots/owner.go).
	must.EqOp(t, alloc.Name[:256], o.AllocName)

	dir, unmount := pool.Look(t, archived)
	b, err := os.ReadFile(filepath.Join(dir, "hello.txt"))
	must.NoError(t, err)
	must.EqOp(t, alloc.ID+"\n", string(b))
	unmount()
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)

	checker := agent.RunJob(t, checkerJob("checker"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, checker.ClientStatus)
	must.EqOp(t, "scratch-0", namesDeviceOf(t, checker, "c"))
	agent.Wait(t, "the checker's release", releaseTimeout, func() (bool, string) {
		a := archivedFor(t, pool, archive, checker.ID)
		state := pollState(pool, servingDataset(pool, parent, slotIdx))
		return a != "" && state == "free", fmt.Sprintf("archive=%q slot state=%q", a, state)
	})
	step("checker found the fresh slot empty and was released too")
}
