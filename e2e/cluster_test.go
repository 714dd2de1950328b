package e2e

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// stateClient is one client of twoStateClients' cluster: its pool, its
// agent and the plugin's parent dataset.
type stateClient struct {
	pool   *zfstest.Pool
	agent  *nomadtest.Agent
	parent string
}

// twoStateClients starts client A (a dev agent: the server too) and client
// B joined to it, each on a pool of its own, the plugin on both with class
// "state" (2 slots, 32M, restore = "required") and, when backups is not
// "", that backup_dir; it waits for their devices and for the server to
// list both. pathA, when not "", is put first on client A's PATH (and so
// on its plugin's: a zfs wrapper's directory).
func twoStateClients(t *testing.T, step func(string, ...any), backups, pathA string) (a, b stateClient) {
	t.Helper()
	pluginBin := devicetest.BuildPlugin(t)
	backupDir := ""
	if backups != "" {
		backupDir = fmt.Sprintf("    backup_dir         = %q\n", backups)
	}
	start := func(name, join, path string) stateClient {
		pool := zfstest.NewPool(t, 0)
		parent := pool.Dataset("nomad")
		pool.ZFS(t, "create", parent)
		agent := nomadtest.StartAgent(t, nomadtest.Options{Join: join, PathFirst: path, PluginDir: filepath.Dir(pluginBin), PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    reserve_timeout    = "20s"
%s    class "state" {
      slots   = 2
      quota   = "32M"
      restore = "required"
    }
  }
}
`, parent, backupDir)})
		agent.WaitForDevice(t, "zfs", "dataset", "state", 2, deviceTimeout)
		step("client %s: node %s at %s, pool %s", name, agent.NodeID[:8], agent.Addr, pool.Name)
		return stateClient{pool: pool, agent: agent, parent: parent}
	}
	a = start("A", "", pathA)
	b = start("B", a.agent.RPCAddr, "")
	nodes, _, err := a.agent.API.Nodes().List(nil)
	must.NoError(t, err)
	must.SliceLen(t, 2, nodes, must.Sprint("one server, two clients"))
	return a, b
}
