package nomadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testenv"
)

func TestPinnedVersionMatchesGoMod(t *testing.T) {
	root, err := localagent.RepoRoot()
	must.NoError(t, err)
	v, err := localagent.PinnedVersionOf(root)
	must.NoError(t, err)
	must.EqOp(t, PinnedVersion, v, must.Sprint("PinnedVersion must follow e2e/nomad/go.mod"))
}

func TestAgentEnv(t *testing.T) {
	env := agentEnv([]string{"PATH=/bin", "NOMAD_ADDR=http://elsewhere:4646", "NOMAD_TOKEN=x", "HOME=/root"}, "http://127.0.0.1:1")
	must.Eq(t, []string{"PATH=/bin", "HOME=/root", "NOMAD_ADDR=http://127.0.0.1:1"}, env)
}

func TestLockFileExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lockFile(path, time.Second)
	must.NoError(t, err)
	_, err = lockFile(path, 1500*time.Millisecond)
	must.ErrorContains(t, err, "still locked")
	unlock()
	unlock2, err := lockFile(path, time.Second)
	must.NoError(t, err)
	unlock2()
}

// TestStartAgentACL starts a real agent with ACLs on and no plugin: the
// management token works, an anonymous client is refused, and Stop ends the
// process.
func TestStartAgentACL(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	a := StartAgent(t, Options{ACL: true})
	must.NotEq(t, "", a.Token)
	must.NotEq(t, "", a.NodeID)

	nodes, _, err := a.API.Nodes().List(nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, nodes)
	must.EqOp(t, a.NodeID, nodes[0].ID)

	tok, err := os.ReadFile(a.TokenFile)
	must.NoError(t, err)
	must.EqOp(t, a.Token, strings.TrimSpace(string(tok)))

	// Plugins inherit the agent's environment: it points at this agent.
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", a.PID))
	must.NoError(t, err)
	vars := strings.Split(string(environ), "\x00")
	must.SliceContains(t, vars, "NOMAD_ADDR="+a.Addr)
	must.SliceContains(t, vars, "NOMAD_TOKEN="+a.Token)

	cfg, err := os.ReadFile(filepath.Join(a.Dir, "agent.hcl"))
	must.NoError(t, err)
	must.StrContains(t, string(cfg), "fingerprint.denylist")

	a.API.SetSecretID("")
	_, _, err = a.API.Nodes().List(nil)
	must.Error(t, err)
	must.True(t, strings.Contains(err.Error(), "403"), must.Sprintf("want 403, got %v", err))
	a.API.SetSecretID(a.Token)

	must.NoError(t, a.Stop())
	must.True(t, a.Exited())
	must.NoError(t, a.Stop(), must.Sprint("Stop is idempotent"))
}
