package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// keeperJob appends its allocation ID to a history in its dataset, prints
// the history, and runs until stopped. Its meta round makes each
// registration a new version of the job.
func keeperJob(round string) nomadtest.JobSpec {
	return nomadtest.JobSpec{ID: "keeper", Type: "service", Reschedule: true, Meta: map[string]string{"round": round}, Tasks: []nomadtest.TaskSpec{{
		Name: "k", KillTimeout: "2s", Device: "zfs/dataset/state",
		Script: "echo $NOMAD_ALLOC_ID >> $ZFS_STATE_PATH/history.txt && cat $ZFS_STATE_PATH/history.txt && exec sleep 3600",
	}}}
}

// TestRestoreEndToEnd: on a class with restore = "required", the data
// follows the job on this node. A stopped and re-run job's new allocation
// starts with what the old one left (restored from the archive by a
// rename), and a job update's replacement allocation keeps the dataset in
// place; each allocation's history shows all of its predecessors.
func TestRestoreEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	archive := parent + "/.archive"
	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{PluginDir: filepath.Dir(pluginBin), PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    reserve_timeout    = "1m"
    class "state" {
      slots   = 1
      quota   = "32M"
      restore = "required"
    }
  }
}
`, parent)})
	agent.WaitForDevice(t, "zfs", "dataset", "state", 1, deviceTimeout)
	step("agent up at %s", agent.Addr)

	k := &keeperRuns{seen: map[string]bool{}, step: step}
	run := func(round string) *api.Allocation { return k.run(t, agent, keeper(round, "")) }

	first := run("1")
	// Stop and run: the dataset goes to the archive, and comes back.
	_, _, err := agent.API.Jobs().Deregister("keeper", false, nil)
	must.NoError(t, err)
	agent.Wait(t, "the first allocation's dataset archived", releaseTimeout, func() (bool, string) {
		return archivedFor(t, pool, archive, first.ID) != "", "not archived yet"
	})
	second := run("2")
	must.Eq(t, "", archivedFor(t, pool, archive, first.ID), must.Sprint("the archive was restored, not copied"))

	// A job update: Nomad replaces the allocation; the replacement keeps
	// the dataset in place.
	third := run("3")
	must.NotEq(t, second.ID, third.ID)
	must.Eq(t, "", archivedFor(t, pool, archive, second.ID))
	step("the data followed the job through a stop and run and an update")
}

// keeperRuns runs rounds of keeperJob and checks that each new allocation
// finds the history of all that came before it.
type keeperRuns struct {
	seen    map[string]bool
	history []string
	step    func(format string, args ...any)
}

// keeper returns keeperJob as round's version, pinned to node nodeID
// unless that is "".
func keeper(round, nodeID string) string {
	job := keeperJob(round)
	if nodeID != "" {
		job.Constraints = []nomadtest.Constraint{{Attribute: "${node.unique.id}", Value: nodeID}}
	}
	return job.HCL()
}

// run registers job (a version of keeperJob) through agent and returns its
// new allocation once it runs and has printed the expected history.
func (k *keeperRuns) run(t *testing.T, agent *nomadtest.Agent, jobHCL string) *api.Allocation {
	t.Helper()
	return k.await(t, agent, agent.RegisterJob(t, jobHCL))
}

// await returns the new allocation of job (a version of keeperJob just
// registered) once it runs and has printed the expected history.
func (k *keeperRuns) await(t *testing.T, agent *nomadtest.Agent, job nomadtest.Job) *api.Allocation {
	t.Helper()
	round := "of job version " + fmt.Sprint(len(k.history)+1)
	var alloc *api.Allocation
	agent.Wait(t, "the allocation "+round+" running", jobTimeout, func() (bool, string) {
		stubs, _, err := agent.API.Jobs().Allocations(job.ID, true, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range stubs {
			if k.seen[s.ID] {
				continue
			}
			if s.ClientStatus != api.AllocClientStatusRunning {
				return false, s.ID + " " + s.ClientStatus
			}
			alloc, _, err = agent.API.Allocations().Info(s.ID, nil)
			return err == nil, fmt.Sprint(err)
		}
		return false, "not placed yet"
	})
	k.seen[alloc.ID] = true
	k.history = append(k.history, alloc.ID)
	agent.Wait(t, "the history of the allocation "+round, holdTimeout, func() (bool, string) {
		out, err := agent.TaskLog(alloc, "k", "stdout")
		return err == nil && strings.Join(strings.Fields(out), " ") == strings.Join(k.history, " "),
			fmt.Sprintf("stdout %q (%v), want %v", out, err, k.history)
	})
	k.step("alloc %s (node %s) found %d predecessor(s)", alloc.ID[:8], alloc.NodeID[:8], len(k.history)-1)
	return alloc
}

// TestRestoreAcrossNodes: the data follows the job to another node through
// backup_dir. One Nomad cluster: a dev agent (the server, and client A on
// its own pool) and a client-only agent (client B, another pool), each
// with the plugin, one backup_dir for both. The job pinned to A writes and
// is stopped: its archive is sent to backup_dir. The same job pinned to B
// (no archive of it there) starts with A's data: Reserve received the
// backup. With backup_dir unreadable, a job of a class with restore =
// "required" does not start on B, and the plugin's error is in its task
// events.
func TestRestoreAcrossNodes(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents and runs jobs")
	step := stepper(t)
	backups := filepath.Join(t.TempDir(), "backups")
	must.NoError(t, os.Mkdir(backups, 0o700))
	clientA, clientB := twoStateClients(t, step, backups, "")
	poolA, agentA, parentA := clientA.pool, clientA.agent, clientA.parent
	poolB, agentB, parentB := clientB.pool, clientB.agent, clientB.parent
	k := &keeperRuns{seen: map[string]bool{}, step: step}

	// On client A.
	first := k.run(t, agentA, keeper("1", agentA.NodeID))
	must.EqOp(t, agentA.NodeID, first.NodeID)
	_, _, err := agentA.API.Jobs().Deregister("keeper", false, nil)
	must.NoError(t, err)
	// The archive is marked as in backup_dir right after its manifest is
	// written: wait for both.
	var manifests []string
	var arch string
	agentA.Wait(t, "the archive in backup_dir, and marked so", releaseTimeout, func() (bool, string) {
		manifests, _ = filepath.Glob(filepath.Join(backups, "nomad-device-zfs", "*", "*.json"))
		if len(manifests) != 1 {
			return false, fmt.Sprintf("%d manifests", len(manifests))
		}
		arch = archivedFor(t, poolA, parentA+"/.archive", first.ID)
		if arch == "" {
			return false, "no archive of the first allocation"
		}
		mark := poolA.Prop(t, arch, "nomad-device-zfs:backup")
		return mark != "" && mark != "-", fmt.Sprintf("%s marked %q", arch, mark)
	})
	step("client A: %s sent to %s", arch, manifests[0])

	// The same job pinned to client B, which has no archive of it.
	second := k.run(t, agentA, keeper("2", agentB.NodeID))
	must.EqOp(t, agentB.NodeID, second.NodeID)
	must.Eq(t, "", archivedFor(t, poolB, parentB+"/.archive", first.ID), must.Sprint("received, then restored into the slot"))
	step("client B: alloc %s started with client A's data", second.ID[:8])

	// backup_dir unreadable: a job whose data cannot be looked for does
	// not start on an empty dataset.
	must.NoError(t, os.Rename(backups, backups+".gone"))
	t.Cleanup(func() { _ = os.Rename(backups+".gone", backups) })
	other := agentA.RegisterJob(t, strings.Replace(keeper("1", agentB.NodeID), `job "keeper"`, `job "other"`, 1))
	failed := agentA.WaitForAlloc(t, other, "failed", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusFailed
	})
	events := nomadtest.DescribeTaskStates(failed)
	must.StrContains(t, events, `has restore = "required"`)
	must.StrContains(t, events, "backup_dir")
	must.StrContains(t, events, "reserve_timeout")
	step("backup_dir unreadable: %s", events)

	// A client-only agent leaves its tasks running when it stops: stop the
	// job first, so that nothing holds pool B when the test ends.
	must.NoError(t, os.Rename(backups+".gone", backups))
	stopKeeperOn(t, agentA, clientB, second)
}

// TestRestoreAcrossNodes_WaitsForItsPredecessor: the job moves to another
// node before its data got there. The job runs on client A (class
// "state", restore = "required", no backup_interval); it is updated to
// run on client B: Nomad stops A's allocation and places its replacement
// on B (PreviousAllocation: A's) at once. The plugin on A archives the
// dataset, and its send to backup_dir is paused (a zfs wrapper first on A's
// PATH). The replacement's Reserve on B waits for it (its log says why)
// rather than start empty (nothing of the job is in backup_dir yet); once
// the send goes on, it starts with A's data: its history names both
// allocations.
func TestRestoreAcrossNodes_WaitsForItsPredecessor(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents and runs jobs")
	step := stepper(t)
	backups := filepath.Join(t.TempDir(), "backups")
	must.NoError(t, os.Mkdir(backups, 0o700))
	w := zfstest.NewWrapper(t)
	clientA, clientB := twoStateClients(t, step, backups, w.Dir)
	agentA, agentB := clientA.agent, clientB.agent
	k := &keeperRuns{seen: map[string]bool{}, step: step}

	first := k.run(t, agentA, keeper("1", agentA.NodeID))
	must.EqOp(t, agentA.NodeID, first.NodeID)
	w.Pause("send")
	t.Cleanup(func() { w.Resume("send") })
	job := agentA.RegisterJob(t, keeper("2", agentB.NodeID))
	args := w.WaitPaused(t, "send", releaseTimeout)
	step("client A: the archive's send paused: zfs %s", strings.Join(args, " "))

	// While A's data is not in backup_dir, the replacement on B waits.
	var second *api.Allocation
	agentA.Wait(t, "the replacement placed on client B", holdTimeout, func() (bool, string) {
		stubs, _, err := agentA.API.Jobs().Allocations(job.ID, true, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range stubs {
			if s.ID != first.ID {
				second, _, err = agentA.API.Allocations().Info(s.ID, nil)
				return err == nil, fmt.Sprint(err)
			}
		}
		return false, "not placed yet"
	})
	must.EqOp(t, first.ID, second.PreviousAllocation, must.Sprint("Nomad names what the replacement replaced"))
	must.EqOp(t, agentB.NodeID, second.NodeID)
	agentB.Wait(t, "the plugin on client B waiting for A's data", holdTimeout, func() (bool, string) {
		log, err := os.ReadFile(agentB.LogPath)
		return err == nil && strings.Contains(string(log), "is not in backup_dir yet"), fmt.Sprint(err)
	})
	second, _, err := agentA.API.Allocations().Info(second.ID, nil)
	must.NoError(t, err)
	must.EqOp(t, api.AllocClientStatusPending, second.ClientStatus, must.Sprintf("the replacement waits for its data: %s", nomadtest.DescribeTaskStates(second)))
	step("client B: alloc %s pending while A's send is paused", second.ID[:8])

	w.Resume("send")
	got := k.await(t, agentA, job)
	must.EqOp(t, second.ID, got.ID)
	step("client B: alloc %s started with client A's data", got.ID[:8])
	stopKeeperOn(t, agentA, clientB, got)
}

// stopKeeperOn stops job keeper, whose allocation alloc runs on client c,
// and waits for its dataset archived there and for c's allocation
// directories collected: a client-only agent leaves its tasks running,
// and their directories (and mounts), when it stops.
func stopKeeperOn(t *testing.T, server *nomadtest.Agent, c stateClient, alloc *api.Allocation) {
	t.Helper()
	_, _, err := server.API.Jobs().Deregister("keeper", false, nil)
	must.NoError(t, err)
	server.Wait(t, "the allocation's dataset archived", releaseTimeout, func() (bool, string) {
		return archivedFor(t, c.pool, c.parent+"/.archive", alloc.ID) != "", "not archived yet"
	})
	// (The API's GC call answers with an empty body, which its decoder
	// reports as EOF: the wait below checks the effect instead.)
	_ = c.agent.API.Nodes().GC(c.agent.NodeID, nil)
	allocDir := filepath.Join(c.agent.Dir, "data", "alloc")
	c.agent.Wait(t, "the client's allocation directories collected", holdTimeout, func() (bool, string) {
		left, err := os.ReadDir(allocDir)
		return err == nil && len(left) == 0, fmt.Sprintf("%d left (%v)", len(left), err)
	})
}
