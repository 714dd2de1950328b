package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// writerJob writes its allocation ID into file in the dataset and runs
// until it is stopped.
func writerJob(id, file string) nomadtest.JobSpec {
	return nomadtest.JobSpec{ID: id, Type: "service", Reschedule: true, Tasks: []nomadtest.TaskSpec{{
		Name: "w", KillTimeout: "2s", Device: "zfs/dataset/scratch",
		Script: "echo $NOMAD_ALLOC_ID > $ZFS_SCRATCH_PATH/" + file + " && exec sleep 3600",
	}}}
}

// checkerJob fails unless its dataset is empty (nothing of a previous
// tenant, not even .zfs/snapshot entries), then writes its own file.
func checkerJob(id string) string {
	return nomadtest.JobSpec{ID: id, Tasks: []nomadtest.TaskSpec{{
		Name: "c", Device: "zfs/dataset/scratch",
		Script: `set -eu
left=$(ls -A "$ZFS_SCRATCH_PATH")
if [ -n "$left" ]; then echo "not empty: $left" >&2; exit 3; fi
snaps=$(ls -A "$ZFS_SCRATCH_PATH/.zfs/snapshot" 2>/dev/null || true)
if [ -n "$snaps" ]; then echo "snapshots: $snaps" >&2; exit 4; fi
echo $NOMAD_ALLOC_ID > "$ZFS_SCRATCH_PATH/owner.txt"
echo "empty dataset $ZFS_SCRATCH_DATASET"
`,
	}}}.HCL()
}

// TestReleaseEndToEnd runs a job that writes into its dataset, stops it,
// waits for the slot to come back fresh and healthy, checks that the archive
// holds the file and the fresh dataset is empty, and runs another job on the
// same (only) slot. With ACLs, the plugin uses a token of the minimal policy
// from the README (examples/acl), read from a token_file written after the
// agent started (so the file is re-read when it changes), and learns its
// node ID without agent:read.
func TestReleaseEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	for _, acl := range []bool{false, true} {
		t.Run(map[bool]string{false: "no_acl", true: "acl_minimal_policy"}[acl], func(t *testing.T) {
			releaseEndToEnd(t, acl)
		})
	}
}

func releaseEndToEnd(t *testing.T, acl bool) {
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	slot := parent + "/scratch/0"
	archive := parent + "/.archive"

	tokenFile := filepath.Join(t.TempDir(), "zfs.token")
	nomadBlock := ""
	if acl {
		// A placeholder until the agent is up and the token exists.
		must.NoError(t, os.WriteFile(tokenFile, []byte("00000000-0000-0000-0000-000000000000\n"), 0o600))
		nomadBlock = fmt.Sprintf("nomad {\n      token_file = %q\n    }", tokenFile)
	}
	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir: filepath.Dir(pluginBin),
		ACL:       acl,
		PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "5s"
    reserve_timeout    = "1m"
    %s
    class "scratch" {
      slots = 1
      quota = "32M"
    }
  }
}
`, parent, nomadBlock),
	})
	step("agent up at %s (acl=%v)", agent.Addr, acl)

	if acl {
		rules, err := os.ReadFile(filepath.Join("..", "examples", "acl", "zfs-plugin.policy.hcl"))
		must.NoError(t, err)
		_, err = agent.API.ACLPolicies().Upsert(&api.ACLPolicy{Name: "zfs-plugin", Description: "nomad-device-zfs", Rules: string(rules)}, nil)
		must.NoError(t, err)
		tok, _, err := agent.API.ACLTokens().Create(&api.ACLToken{Name: "nomad-device-zfs", Type: "client", Policies: []string{"zfs-plugin"}}, nil)
		must.NoError(t, err)
		must.NoError(t, os.WriteFile(tokenFile, []byte(tok.SecretID+"\n"), 0o600))
		step("minimal-policy token written to %s", tokenFile)
	}

	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	guid := pool.Prop(t, slot, "guid")

	// 1. A service job writes into its dataset and runs until stopped.
	writer := agent.RegisterJob(t, writerJob("writer", "owner.txt").HCL())
	alloc := agent.WaitForAlloc(t, writer, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	mp := pool.Prop(t, slot, "mountpoint")
	agent.Wait(t, "owner.txt from the writer", holdTimeout, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(mp, "owner.txt"))
		return err == nil && string(b) == alloc.ID+"\n", fmt.Sprintf("%q %v", b, err)
	})
	agent.Wait(t, "the owner stamped", holdTimeout, func() (bool, string) {
		v := recordedOwner(t, pool, slot).AllocID
		return v == alloc.ID, "owner alloc ID=" + v
	})
	step("writer %s holds %s", alloc.ID[:8], slot)

	// 2. Stop it: the plugin archives the dataset and puts a fresh one back.
	_, _, err := agent.API.Jobs().Deregister(writer.ID, false, nil)
	must.NoError(t, err)
	agent.WaitForAlloc(t, writer, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	step("writer stopped")
	var archived string
	agent.Wait(t, "the slot fresh again", releaseTimeout, func() (bool, string) {
		archived = archivedFor(t, pool, archive, alloc.ID)
		// The slot serves its spare, made while the writer ran (or a
		// dataset made in its place).
		slot = servingDataset(pool, parent, 0)
		state := pollState(pool, slot)
		return archived != "" && state == "free" && pollProp(pool, slot, "guid") != guid &&
				pollState(pool, archived) == "archived",
			fmt.Sprintf("archive=%q slot %s state=%q", archived, slot, state)
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	step("released to %s", archived)
	must.EqOp(t, "writer", recordedOwner(t, pool, archived).Job)
	must.EqOp(t, agent.NodeID, recordedOwner(t, pool, archived).NodeID)
	entries, err := os.ReadDir(pool.Prop(t, slot, "mountpoint"))
	must.NoError(t, err)
	must.SliceEmpty(t, entries)
	dir, unmount := pool.Look(t, archived)
	b, err := os.ReadFile(filepath.Join(dir, "owner.txt"))
	must.NoError(t, err)
	must.EqOp(t, alloc.ID+"\n", string(b))
	unmount()

	// 3. The same slot again: the new tenant finds it empty.
	checker := agent.RunJob(t, checkerJob("checker"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, checker.ClientStatus)
	must.EqOp(t, "scratch-0", checker.AllocatedResources.Tasks["c"].Devices[0].DeviceIDs[0])
	agent.Wait(t, "the checker's release", releaseTimeout, func() (bool, string) {
		a := archivedFor(t, pool, archive, checker.ID)
		return a != "" && pollState(pool, servingDataset(pool, parent, 0)) == "free", "archive=" + a
	})
	step("second tenant ran on the fresh slot and was released too")
}
