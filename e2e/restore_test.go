package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// keeperJob appends its allocation ID to a history in its dataset, prints
// the history, and runs until stopped. ROUND makes each registration a new
// version of the job.
const keeperJob = `
job "keeper" {
  type = "service"
  meta { round = "ROUND" }
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "k" {
      driver = "exec"
      kill_timeout = "2s"
      config {
        command = "/bin/sh"
        args = ["-c", "echo $NOMAD_ALLOC_ID >> $ZFS_STATE_PATH/history.txt && cat $ZFS_STATE_PATH/history.txt && exec sleep 3600"]
      }
      resources {
        cpu    = 100
        memory = 32
        device "zfs/dataset/state" { count = 1 }
      }
    }
  }
}
`

// TestRestoreEndToEnd: on a class with restore = "required", the data
// follows the job on this node. A stopped and re-run job's new allocation
// starts with what the old one left (restored from the archive by a
// rename), and a job update's replacement allocation keeps the dataset in
// place; each allocation's history shows all of its predecessors.
func TestRestoreEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	start := time.Now()
	step := func(format string, args ...any) {
		t.Logf("[%6.1fs] %s", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
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
	run := func(round string) *api.Allocation { return k.run(t, agent, round) }

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

// run registers round's version of keeperJob on agent and returns its new
// allocation once it runs and has printed the expected history.
func (k *keeperRuns) run(t *testing.T, agent *nomadtest.Agent, round string) *api.Allocation {
	t.Helper()
	job := agent.RegisterJob(t, strings.Replace(keeperJob, "ROUND", round, 1))
	var alloc *api.Allocation
	agent.Wait(t, "round "+round+"'s allocation running", jobTimeout, func() (bool, string) {
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
	agent.Wait(t, "round "+round+"'s history", holdTimeout, func() (bool, string) {
		out, err := agent.TaskLog(alloc, "k", "stdout")
		return err == nil && strings.Join(strings.Fields(out), " ") == strings.Join(k.history, " "),
			fmt.Sprintf("stdout %q (%v), want %v", out, err, k.history)
	})
	k.step("round %s: alloc %s found %d predecessor(s)", round, alloc.ID[:8], len(k.history)-1)
	return alloc
}

// TestRestoreAcrossNodes: the data follows the job to another node through
// backup_dir. Node A (its own pool and agent) runs the job and stops it:
// the archive is sent to backup_dir. Node B (another pool and agent, no
// archive of the job) runs the job: Reserve receives the backup and the
// allocation finds A's data. With backup_dir unreadable, a job of a class
// with restore = "required" does not start on B, and the plugin's error is
// in its task events.
func TestRestoreAcrossNodes(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents and runs jobs")
	start := time.Now()
	step := func(format string, args ...any) {
		t.Logf("[%6.1fs] %s", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	backups := filepath.Join(t.TempDir(), "backups")
	must.NoError(t, os.Mkdir(backups, 0o700))
	pluginBin := devicetest.BuildPlugin(t)
	node := func(name string) (*zfstest.Pool, *nomadtest.Agent, string) {
		pool := zfstest.NewPool(t, 0)
		parent := pool.Dataset("nomad")
		pool.ZFS(t, "create", parent)
		agent := nomadtest.StartAgent(t, nomadtest.Options{PluginDir: filepath.Dir(pluginBin), PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    reserve_timeout    = "20s"
    backup_dir         = %q
    class "state" {
      slots   = 2
      quota   = "32M"
      restore = "required"
    }
  }
}
`, parent, backups)})
		agent.WaitForDevice(t, "zfs", "dataset", "state", 2, deviceTimeout)
		step("node %s: agent up at %s, pool %s", name, agent.Addr, pool.Name)
		return pool, agent, parent
	}
	k := &keeperRuns{seen: map[string]bool{}, step: step}

	// Node A. (The two nodes are two dev agents, one after the other: two
	// Nomad clients on one host would share its cgroups.)
	poolA, agentA, parentA := node("A")
	first := k.run(t, agentA, "1")
	_, _, err := agentA.API.Jobs().Deregister("keeper", false, nil)
	must.NoError(t, err)
	var manifests []string
	agentA.Wait(t, "the archive in backup_dir", releaseTimeout, func() (bool, string) {
		manifests, _ = filepath.Glob(filepath.Join(backups, "nomad-device-zfs", "*", "*.json"))
		return len(manifests) == 1, fmt.Sprintf("%d manifests", len(manifests))
	})
	arch := archivedFor(t, poolA, parentA+"/.archive", first.ID)
	must.NotEq(t, "", arch)
	must.NotEq(t, "", poolA.Prop(t, arch, "nomad-device-zfs:backup"))
	step("node A: %s sent to %s", arch, manifests[0])
	must.NoError(t, agentA.Stop())

	// Node B: no archive of the job; its allocation gets A's data.
	poolB, agentB, parentB := node("B")
	second := k.run(t, agentB, "2")
	must.Eq(t, "", archivedFor(t, poolB, parentB+"/.archive", first.ID), must.Sprint("received, then restored into the slot"))
	step("node B: alloc %s started with node A's data", second.ID[:8])

	// backup_dir unreadable: a job whose data cannot be looked for does
	// not start on an empty dataset.
	must.NoError(t, os.Rename(backups, backups+".gone"))
	t.Cleanup(func() { _ = os.Rename(backups+".gone", backups) })
	other := agentB.RegisterJob(t, strings.Replace(strings.Replace(keeperJob, `job "keeper"`, `job "other"`, 1), "ROUND", "1", 1))
	failed := agentB.WaitForAlloc(t, other, "failed", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusFailed
	})
	events := nomadtest.DescribeTaskStates(failed)
	must.StrContains(t, events, `has restore = "required"`)
	must.StrContains(t, events, "backup_dir")
	must.StrContains(t, events, "reserve_timeout")
	step("backup_dir unreadable: %s", events)
}
