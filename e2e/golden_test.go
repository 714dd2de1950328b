package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// goldenJob prints the golden file it finds, then overwrites it and adds a
// file of its own: neither may reach the snapshot or the next tenant.
func goldenJob(id string) string {
	return nomadtest.JobSpec{ID: id, Tasks: []nomadtest.TaskSpec{{
		Name: "t", Device: "zfs/dataset/ci",
		Script: `set -eu
echo "seed: $(cat "$ZFS_CI_PATH/seed.txt")"
echo "files: $(ls -A "$ZFS_CI_PATH" | tr '\n' ' ')"
echo "written by $NOMAD_JOB_ID" > "$ZFS_CI_PATH/seed.txt"
echo x > "$ZFS_CI_PATH/$NOMAD_JOB_ID.txt"
`,
	}}}.HCL()
}

// TestGoldenSourceEndToEnd: a class whose fresh slots are clones of a
// golden snapshot. A job finds the golden file; what it writes reaches
// neither the snapshot nor the next tenant; after the operator moves the
// class to a new snapshot (a new agent configuration), the next tenant
// finds the new contents, and the old snapshot can then be destroyed, as
// docs/configuration.md says.
func TestGoldenSourceEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent, gold := pool.Dataset("nomad"), pool.Dataset("golden")
	pool.ZFS(t, "create", parent)
	pool.ZFS(t, "create", gold)
	goldMP := pool.Prop(t, gold, "mountpoint")
	snapshot := func(name, content string) string {
		seed := filepath.Join(goldMP, "seed.txt")
		must.NoError(t, os.WriteFile(seed, []byte(content), 0o644))
		// The operator gives the tasks (nobody under exec) its files.
		must.NoError(t, os.Chown(seed, 65534, 65534))
		pool.ZFS(t, "snapshot", gold+"@"+name)
		return gold + "@" + name
	}
	v1 := snapshot("v1", "golden v1")
	pluginBin := devicetest.BuildPlugin(t)
	agentWith := func(source string) *nomadtest.Agent {
		return nomadtest.StartAgent(t, nomadtest.Options{PluginDir: filepath.Dir(pluginBin), PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    class "ci" {
      slots  = 1
      quota  = "32M"
      source = %q
    }
  }
}
`, parent, source)})
	}
	run := func(agent *nomadtest.Agent, id string) string {
		alloc := agent.RunJob(t, goldenJob(id), jobTimeout)
		must.Eq(t, api.AllocClientStatusComplete, alloc.ClientStatus)
		out, err := agent.TaskLog(alloc, "t", "stdout")
		must.NoError(t, err)
		return out
	}

	agent := agentWith(v1)
	agent.WaitForDevice(t, "zfs", "dataset", "ci", 1, deviceTimeout)
	step("agent up with source %s", v1)
	out := run(agent, "first")
	must.StrContains(t, out, "seed: golden v1\n")
	must.StrContains(t, out, "files: seed.txt \n")
	// The next tenant: a fresh clone, without the first one's writes.
	agent.WaitForDevice(t, "zfs", "dataset", "ci", 1, deviceTimeout)
	out = run(agent, "second")
	must.StrContains(t, out, "seed: golden v1\n")
	must.StrContains(t, out, "files: seed.txt \n")
	step("two tenants each found golden v1 alone")
	// The snapshot itself is as it was.
	look := pool.Dataset("look")
	pool.ZFS(t, "clone", v1, look)
	b, err := os.ReadFile(filepath.Join(pool.Prop(t, look, "mountpoint"), "seed.txt"))
	must.NoError(t, err)
	must.Eq(t, "golden v1", string(b))
	pool.ZFS(t, "destroy", look)

	// The operator's documented step: a new snapshot, the class moved to
	// it, the agent restarted. The restart comes once the second tenant's
	// dataset is released: the slot serves its spare at once, so a healthy
	// device does not say so. (The next agent is a new dev cluster that
	// has never heard of the second tenant; a dataset still in its name
	// would rightly be kept, and the slot shown unhealthy.)
	agent.WaitForDevice(t, "zfs", "dataset", "ci", 1, deviceTimeout)
	agent.Wait(t, "the second tenant's dataset released", deviceTimeout, func() (bool, string) {
		// One read of every dataset: the release renames the spare into
		// place and destroys the old one while the test looks.
		states, err := pollStates(pool, parent+"/ci")
		if err != nil {
			return false, err.Error()
		}
		for _, st := range states {
			if st != string(record.StateFree) {
				return false, fmt.Sprint(states)
			}
		}
		return len(states) > 0, fmt.Sprint(states)
	})
	must.NoError(t, agent.Stop())
	v2 := snapshot("v2", "golden v2")
	agent = agentWith(v2)
	agent.WaitForDevice(t, "zfs", "dataset", "ci", 1, deviceTimeout)
	agent.Wait(t, "every slot dataset made again from "+v2, deviceTimeout, func() (bool, string) {
		b, err := pool.Runner.ZFSCmd(context.Background(), "list", "-H", "-o", "name,origin", "-r", parent+"/ci")
		if err != nil {
			return false, err.Error()
		}
		list := string(b)
		return !strings.Contains(list, v1) && strings.Contains(list, v2), list
	})
	out = run(agent, "third")
	must.StrContains(t, out, "seed: golden v2\n")
	step("after the move, the next tenant found golden v2")

	// No slot depends on v1 any more: `status` says so, and the operator
	// can destroy it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent.WaitForDevice(t, "zfs", "dataset", "ci", 1, deviceTimeout)
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset = %q
    class "ci" {
      slots  = 1
      quota  = "32M"
      source = %q
    }
  }
}
`, parent, v2)), 0o644))
	b, err = exec.CommandContext(ctx, pluginBin, "status", "-config", cfgFile, "-address", agent.Addr).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(b)))
	status := string(b)
	must.StrContains(t, status, "class ci: source "+v2+"\n")
	must.False(t, strings.Contains(status, "older source"), must.Sprint(status))
	pool.ZFS(t, "destroy", v1)
	step("status shows no slot on %s, and it is destroyed", v1)
}
