package e2e

import (
	"fmt"
	"os"
	"os/exec"
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

// runnerJob is a parameterized batch job: every dispatch is a new job
// ("runner/dispatch-<time>-<id>") whose parent is runner, as every run of a
// periodic job is a new job whose parent is the periodic one.
var runnerJob = nomadtest.JobSpec{ID: "runner", Parameterized: true, Tasks: []nomadtest.TaskSpec{{
	Name: "w", Script: "echo $NOMAD_JOB_ID > $ZFS_SCRATCH_PATH/run.txt", Device: "zfs/dataset/scratch",
}}}.HCL()

// TestRetention_DispatchedRunsAreTheirParentsIdentity: each dispatch of a
// parameterized job (as each run of a periodic job) is a new job, and its
// data belongs to the parent job: the plugin records the parent with the
// owner, so keep = 1 prunes the earlier runs' archives, and the archive
// holds the newest run's data only, under the parent's identity.
func TestRetention_DispatchedRunsAreTheirParentsIdentity(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	archive := parent + "/.archive"
	pluginBin := devicetest.BuildPlugin(t)
	pluginConfig := fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    class "scratch" {
      slots = 1
      quota = "32M"
      keep  = 1
    }
  }
}
`, parent)
	agent := nomadtest.StartAgent(t, nomadtest.Options{PluginDir: filepath.Dir(pluginBin), PluginConfig: pluginConfig})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	step("agent up at %s", agent.Addr)
	runner := agent.RegisterJob(t, runnerJob)

	var last, lastJob string
	for round := 1; round <= 3; round++ {
		resp, _, err := agent.API.Jobs().Dispatch(runner.ID, nil, nil, "", nil)
		must.NoError(t, err)
		child := nomadtest.Job{ID: resp.DispatchedJobID, EvalID: resp.EvalID}
		alloc := agent.WaitForAlloc(t, child, "complete", jobTimeout, (*api.Allocation).ClientTerminalStatus)
		if alloc.ClientStatus != api.AllocClientStatusComplete {
			agent.LogAlloc(t, alloc)
		}
		must.EqOp(t, api.AllocClientStatusComplete, alloc.ClientStatus)
		must.StrHasPrefix(t, "runner/dispatch-", child.ID)
		agent.Wait(t, fmt.Sprintf("round %d's dataset archived", round), releaseTimeout, func() (bool, string) {
			last = archivedFor(t, pool, archive, alloc.ID)
			return last != "", "not archived yet"
		})
		o := recordedOwner(t, pool, last)
		must.EqOp(t, child.ID, o.Job)
		must.EqOp(t, "runner", o.Parent, must.Sprint("the parent job is recorded with the owner"))
		step("round %d: %s (alloc %s) archived as %s", round, child.ID, alloc.ID[:8], last)
		// keep = 1 counts the runs of one parent: the earlier run's
		// archive is pruned.
		agent.Wait(t, "the archive to hold only the newest run", releaseTimeout, func() (bool, string) {
			got := strings.Fields(pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", archive))
			return len(got) == 2 && got[1] == last, strings.Join(got, " ")
		})
		lastJob = child.ID
	}
	dir, unmount := pool.Look(t, last)
	b, err := os.ReadFile(filepath.Join(dir, "run.txt"))
	must.NoError(t, err)
	must.EqOp(t, lastJob, strings.TrimSpace(string(b)))
	unmount()

	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(pluginConfig), 0o644))
	out, err := exec.Command(pluginBin, "archives", "-config", cfgFile).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "1 archive,")
	must.StrContains(t, string(out), "default/runner/g[0]/w (scratch)")
	step("one archive, under the parent's identity")
}
