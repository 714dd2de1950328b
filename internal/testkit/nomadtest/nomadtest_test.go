package nomadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
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

func TestPathFirst(t *testing.T) {
	cases := []struct {
		name     string
		env, out []string
	}{
		{name: "path", env: []string{"HOME=/root", "PATH=/bin:/usr/bin"}, out: []string{"HOME=/root", "PATH=/w/bin:/bin:/usr/bin"}},
		{name: "no path", env: []string{"HOME=/root"}, out: []string{"HOME=/root"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			must.Eq(t, c.out, pathFirst(c.env, "/w/bin"))
		})
	}
}

// Options.ClientConfig goes inside the client block, beside the chroot_env
// block.
func TestAgentConfigClient(t *testing.T) {
	cfg := agentConfig(Options{ClientConfig: "cpu_total_compute = 4000", LogLevel: "TRACE"}, []int{1, 2, 3}, "  chroot_env {}\n")
	client := cfg[strings.Index(cfg, "client {"):]
	must.StrContains(t, client, "\n  cpu_total_compute = 4000\n")
	must.StrContains(t, client, "  chroot_env {}\n}")
	must.StrContains(t, cfg, `log_level            = "TRACE"`)
}

// Options.ServerConfig goes in a server block of a dev agent's
// configuration; a client-only agent (Options.Join) runs no server and gets
// none.
func TestAgentConfigServer(t *testing.T) {
	cases := []struct {
		name   string
		opts   Options
		server string // the server block, "" for none
	}{
		{name: "dev agent", opts: Options{ServerConfig: `heartbeat_grace = "4s"`},
			server: "server {\n  heartbeat_grace = \"4s\"\n}\n"},
		{name: "client-only agent", opts: Options{ServerConfig: `heartbeat_grace = "4s"`, Join: "127.0.0.1:4647"}},
		{name: "none", opts: Options{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := agentConfig(c.opts, []int{1, 2, 3}, "  chroot_env {}\n")
			if c.server == "" {
				must.StrNotContains(t, cfg, "server {")
				return
			}
			must.StrContains(t, cfg, "\n"+c.server)
		})
	}
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

// TestSchedulerLines keeps the lines that trace an evaluation (lines as a
// Nomad 1.11 dev agent writes them) and the deregistrations that start
// one, and drops the rest: the plugin's lines and the API reads of a
// test's own polls among them.
func TestSchedulerLines(t *testing.T) {
	lines := []struct {
		line string
		keep bool
	}{
		{`2026-11-25T07:16:37.100Z [DEBUG] http: request complete: method=DELETE path=/v1/job/holder?purge=false duration=20.5ms`, true},
		{`2026-11-25T07:16:37.101Z [DEBUG] worker: dequeued evaluation: worker_id=3e44 eval_id=e5e4 type=service namespace=default job_id=holder triggered_by=job-deregister`, true},
		{`2026-11-25T07:16:37.102Z [ERROR] client.device_mgr.nomad-device-zfs: conflict: keeping the data: device=scratch-0`, false},
		{`2026-11-25T07:16:37.103Z [DEBUG] worker.service_sched: reconciled current state with desired state: eval_id=e5e4 job_id=holder total_stop=1`, true},
		{`2026-11-25T07:16:37.104Z [DEBUG] http: request complete: method=GET path=/v1/job/holder/evaluations duration=1.2ms`, false},
		{`2026-11-25T07:16:37.105Z [INFO]  nomad: plan for node rejected: node_id=bab7 reason="reserved alloc port collision" eval_id=e5e4`, true},
		{`2026-11-25T07:16:37.106Z [DEBUG] client: updated allocations: index=36 total=2 pulled=1 filtered=1`, false},
		{`2026-11-25T07:16:37.107Z [DEBUG] worker: ack evaluation: worker_id=3e44 eval_id=e5e4`, true},
	}
	var all, want []string
	for _, l := range lines {
		all = append(all, l.line)
		if l.keep {
			want = append(want, l.line)
		}
	}
	path := filepath.Join(t.TempDir(), "agent.log")
	must.NoError(t, os.WriteFile(path, []byte(strings.Join(all, "\n")+"\n"), 0o600))
	a := &Agent{LogPath: path}

	must.Eq(t, strings.Join(want, "\n"), a.schedulerLines(40))
	must.Eq(t, strings.Join(want[len(want)-2:], "\n"), a.schedulerLines(2), must.Sprint("n keeps the last lines"))
}
