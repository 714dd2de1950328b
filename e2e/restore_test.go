package e2e

import (
	"fmt"
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

	seen := map[string]bool{}
	var history []string
	// run registers round's version of the job and returns its new
	// allocation once running, checking that its history is what came
	// before plus itself.
	run := func(round string) *api.Allocation {
		t.Helper()
		job := agent.RegisterJob(t, strings.Replace(keeperJob, "ROUND", round, 1))
		var alloc *api.Allocation
		agent.Wait(t, "round "+round+"'s allocation running", jobTimeout, func() (bool, string) {
			stubs, _, err := agent.API.Jobs().Allocations(job.ID, true, nil)
			if err != nil {
				return false, err.Error()
			}
			for _, s := range stubs {
				if seen[s.ID] {
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
		seen[alloc.ID] = true
		history = append(history, alloc.ID)
		agent.Wait(t, "round "+round+"'s history", holdTimeout, func() (bool, string) {
			out, err := agent.TaskLog(alloc, "k", "stdout")
			return err == nil && strings.Fields(out) != nil && strings.Join(strings.Fields(out), " ") == strings.Join(history, " "),
				fmt.Sprintf("stdout %q (%v), want %v", out, err, history)
		})
		step("round %s: alloc %s found %d predecessor(s)", round, alloc.ID[:8], len(history)-1)
		return alloc
	}

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
