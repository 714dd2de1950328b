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

// TestRetentionEndToEnd runs the same service (one identity: default,
// writer, g[0], w) three times on a class with keep = 1 and an
// archive_quota: after each release the plugin prunes the older archive,
// so the archive holds only the newest tenant's data, under the quota the
// plugin set; `archives` shows it and `prune -dry-run` finds nothing due.
func TestRetentionEndToEnd(t *testing.T) {
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
    archive_quota      = "96M"
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

	seen := map[string]bool{}
	var archived []string
	for round := 1; round <= 3; round++ {
		// Each round is a new version of the same job: one more
		// allocation of writer.g[0].
		spec := writerJob("writer", "owner.txt")
		spec.Meta = map[string]string{"round": fmt.Sprint(round)}
		job := agent.RegisterJob(t, spec.HCL())
		var alloc *api.AllocationListStub
		agent.Wait(t, fmt.Sprintf("round %d's allocation running", round), jobTimeout, func() (bool, string) {
			stubs, _, err := agent.API.Jobs().Allocations(job.ID, true, nil)
			if err != nil {
				return false, err.Error()
			}
			for _, s := range stubs {
				if !seen[s.ID] {
					alloc = s
					return s.ClientStatus == api.AllocClientStatusRunning, s.ID + " " + s.ClientStatus
				}
			}
			return false, "not placed yet"
		})
		seen[alloc.ID] = true
		must.EqOp(t, "writer.g[0]", alloc.Name)
		_, _, err := agent.API.Jobs().Deregister(job.ID, false, nil)
		must.NoError(t, err)
		var name string
		agent.Wait(t, fmt.Sprintf("round %d's dataset archived", round), releaseTimeout, func() (bool, string) {
			name = archivedFor(t, pool, archive, alloc.ID)
			return name != "", "not archived yet"
		})
		archived = append(archived, name)
		step("round %d: alloc %s archived as %s", round, alloc.ID[:8], name)
		// keep = 1: the previous round's archive is pruned.
		agent.Wait(t, "the archive to hold only the newest", releaseTimeout, func() (bool, string) {
			out := pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", archive)
			got := strings.Fields(out)
			return len(got) == 2 && got[1] == name, strings.Join(got, " ")
		})
	}
	// The newest archive holds the last tenant's file.
	last := archived[len(archived)-1]
	dir, unmount := pool.Look(t, last)
	b, err := os.ReadFile(filepath.Join(dir, "owner.txt"))
	must.NoError(t, err)
	must.StrContains(t, string(b), recordedOwner(t, pool, last).AllocID)
	unmount()
	must.Eq(t, "100663296", pool.Prop(t, archive, "quota"))

	// The node says which job groups have data here, for an affinity.
	agent.Wait(t, "the node metadata", holdTimeout, func() (bool, string) {
		m, err := agent.API.Nodes().Meta().Read(agent.NodeID, nil)
		if err != nil {
			return false, err.Error()
		}
		v := m.Meta["nomad_device_zfs.archives"]
		return v == "default/writer/g", "nomad_device_zfs.archives=" + v
	})

	// The operator's view: the plugin binary, as a person runs it.
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(pluginConfig), 0o644))
	out, err := exec.Command(pluginBin, "archives", "-config", cfgFile).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "1 archive,")
	must.StrContains(t, string(out), "default/writer/g[0]/w (scratch)")
	must.StrContains(t, string(out), last)
	out, err = exec.Command(pluginBin, "prune", "-dry-run", "-config", cfgFile).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "Nothing to prune")
	step("archives and prune -dry-run agree")
}
