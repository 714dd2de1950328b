package nomadtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
)

const (
	// startTimeout bounds the wait for the API and a ready node.
	startTimeout = 2 * time.Minute
	// stopTimeout is how long Stop waits after SIGINT before SIGKILL. A dev
	// agent destroys its allocations as it stops (unmounting their task
	// directories); on a loaded 2-core machine that took over 30 s.
	stopTimeout = 90 * time.Second
	// logTailLines is how much of the agent log a failed test shows.
	logTailLines = 150
	// schedLines is how many of the scheduler's lines a failed test shows.
	schedLines = 40
	// startAttempts covers a free port taken by another process between
	// picking it and the agent binding it.
	startAttempts = 3
)

// Options configures StartAgent.
type Options struct {
	// PluginDir is the agent's -plugin-dir (a fresh empty directory when
	// empty).
	PluginDir string
	// PluginConfig is HCL appended to the agent configuration, normally a
	// whole `plugin "nomad-device-zfs" { config { ... } }` block.
	PluginConfig string
	// ACL enables ACLs and bootstraps them; Agent.Token is the management
	// token and Agent.API uses it. The token is also in the agent's
	// environment as NOMAD_TOKEN (so plugins that use the standard NOMAD_*
	// variables have it) and in the file Agent.TokenFile.
	ACL bool
	// LogLevel of the agent ("DEBUG" when empty, so plugin logs show).
	LogLevel string
	// Join, when set, is the RPC address of a running agent's server
	// (Agent.RPCAddr): the agent then runs as a client only, another node
	// of that cluster, instead of a dev agent of its own.
	Join string

	// Dir is the agent's directory: agent.hcl, agent.log, data/, and
	// plugins/ when PluginDir is empty. StartAgent uses a new t.TempDir()
	// when it is empty; Start requires it.
	Dir string
	// ClientConfig is HCL added inside the agent's client block, such as
	// `cpu_total_compute = 4000`.
	ClientConfig string
	// ServerConfig is HCL put in a server block of a dev agent's
	// configuration (never of a client-only one, Options.Join), such as
	// `heartbeat_grace = "4s"`; it merges with -dev's server settings.
	ServerConfig string
	// Chroot is the client's chroot_env block (as localagent.ChrootEnv
	// returns it) instead of the tests' (taskPrograms).
	Chroot string
	// PathFirst, when set, is a directory put first on the agent's PATH
	// (and so on its plugins').
	PathFirst string
	// StopTimeout is how long Stop waits after SIGINT before SIGKILL
	// (stopTimeout when zero).
	StopTimeout time.Duration
}

// Agent is a running dev-mode Nomad agent (server and client in one
// process) started by StartAgent.
type Agent struct {
	// Addr is the HTTP address, such as http://127.0.0.1:41234.
	Addr string
	// RPCAddr is the agent's RPC address (host:port), which a client-only
	// agent joins (Options.Join).
	RPCAddr string
	// join: a client-only agent (Options.Join).
	join bool
	// API is a client of Addr (with Token when ACLs are on).
	API *api.Client
	// NodeID is the ID of the agent's own client node.
	NodeID string
	// Token is the management token's secret when Options.ACL, and
	// TokenFile a file that holds it.
	Token     string
	TokenFile string
	// PID is the agent process's PID.
	PID int
	// stopTimeout is Options.StopTimeout, or the package's stopTimeout.
	stopTimeout time.Duration
	// Dir holds agent.hcl, agent.log and the data directory.
	Dir       string
	LogPath   string
	PluginDir string

	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process has exited
	exitErr  error         // set before exited is closed
	stopOnce sync.Once
	stopErr  error
}

// StartAgent starts `nomad agent -dev` on free loopback ports with the given
// plugin directory and configuration, waits until its API answers and its
// node is ready, and stops it (by its PID) when the test ends. On test
// failure the tail of the agent log is logged.
//
// The agent runs with the caller's environment minus every NOMAD_* variable,
// plus NOMAD_ADDR set to its own address (and NOMAD_TOKEN with ACLs). Nomad
// passes its environment to the plugins it launches, so a plugin that finds
// the Nomad API through the standard variables talks to this agent, never
// to one at the default address or to the caller's.
func StartAgent(t testing.TB, opts Options) *Agent {
	t.Helper()
	bin := Binary(t)
	var a *Agent
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		a, err = startAgent(t, bin, opts)
		if err == nil {
			return a
		}
		if a == nil || !strings.Contains(a.logText(), "address already in use") {
			break
		}
		t.Logf("nomad agent attempt %d lost a port race; retrying: %v", attempt, err)
	}
	// The cleanup registered by startAgent shows the log tail.
	t.Fatalf("starting nomad agent: %v", err)
	return nil
}

func startAgent(t testing.TB, bin string, opts Options) (*Agent, error) {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	a, err := start(context.Background(), bin, opts)
	if a == nil {
		return nil, err
	}
	// Cleanups run last-in first-out: the agent stops, then the log tail of a
	// failed test is shown (including the shutdown).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nomad agent log (%s), last %d lines:\n%s", a.LogPath, logTailLines, a.LogTail(logTailLines))
			t.Logf("nomad agent log, the scheduler's lines (last %d):\n%s", schedLines, a.schedulerLines(schedLines))
		}
	})
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			t.Errorf("stopping nomad agent (pid %d): %v", a.PID, err)
		}
	})
	if err != nil {
		return a, err
	}
	t.Logf("nomad agent pid %d at %s, node %s, log %s", a.PID, a.Addr, a.NodeID, a.LogPath)
	return a, nil
}

// Start starts `nomad agent` (bin) as StartAgent does, outside a test:
// in opts.Dir, which must be set, and with no retry on a lost port race.
// It returns once the agent's node is ready or ctx is done; the caller
// stops the agent (Stop). On error no agent is left running, and the
// error names the agent log.
func Start(ctx context.Context, bin string, opts Options) (*Agent, error) {
	if opts.Dir == "" {
		return nil, errors.New("nomadtest.Start: no Options.Dir")
	}
	a, err := start(ctx, bin, opts)
	if err != nil {
		if a == nil {
			return nil, err
		}
		_ = a.Stop()
		return nil, fmt.Errorf("nomad agent (log %s): %w", a.LogPath, err)
	}
	return a, nil
}

// start starts the agent in opts.Dir and waits until it is ready. It
// returns a nil Agent when no process was started, and the Agent with the
// error when one was (stopped when it is not ready).
func start(ctx context.Context, bin string, opts Options) (*Agent, error) {
	dir := opts.Dir
	a := &Agent{
		Dir:         dir,
		LogPath:     filepath.Join(dir, "agent.log"),
		PluginDir:   opts.PluginDir,
		exited:      make(chan struct{}),
		stopTimeout: opts.StopTimeout,
	}
	if a.stopTimeout == 0 {
		a.stopTimeout = stopTimeout
	}
	if a.PluginDir == "" {
		a.PluginDir = filepath.Join(dir, "plugins")
		if err := os.Mkdir(a.PluginDir, 0o755); err != nil {
			return nil, err
		}
	}
	ports, err := localagent.FreeLoopbackPorts(3)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "agent.hcl")
	chroot := opts.Chroot
	if chroot == "" {
		if chroot, err = taskChroot(); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(cfgPath, []byte(agentConfig(opts, ports, chroot)), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(a.LogPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor

	dataDir := filepath.Join(dir, "data")
	mode := []string{"-dev"}
	if opts.Join != "" {
		mode = []string{"-client", "-servers", opts.Join}
	}
	a.cmd = exec.Command(bin, append(append([]string{"agent"}, mode...), "-bind", "127.0.0.1",
		"-data-dir", dataDir, "-plugin-dir", a.PluginDir, "-config", cfgPath)...)
	a.Addr = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	a.RPCAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
	a.join = opts.Join != ""
	env := agentEnv(os.Environ(), a.Addr)
	if opts.PathFirst != "" {
		env = pathFirst(env, opts.PathFirst)
	}
	if opts.ACL {
		a.Token = newUUID()
		a.TokenFile = filepath.Join(dir, "acl-token")
		if err := os.WriteFile(a.TokenFile, []byte(a.Token+"\n"), 0o600); err != nil {
			return nil, err
		}
		env = append(env, "NOMAD_TOKEN="+a.Token)
	}
	a.cmd.Env = env
	a.cmd.Dir = dir
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	// If the test process dies without cleanup, the agent shuts down.
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGINT}
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	a.PID = a.cmd.Process.Pid
	go func() {
		a.exitErr = a.cmd.Wait()
		close(a.exited)
	}()

	a.API, err = api.NewClient(&api.Config{Address: a.Addr, TLSConfig: &api.TLSConfig{}})
	if err != nil {
		return a, err
	}
	if err := a.waitReady(ctx); err != nil {
		_ = a.Stop()
		return a, err
	}
	return a, nil
}

func agentConfig(opts Options, ports []int, chroot string) string {
	level := opts.LogLevel
	if level == "" {
		level = "DEBUG"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by nomadtest.StartAgent.
log_level            = %q
disable_update_check = true

ports {
  http = %d
  rpc  = %d
  serf = %d
}

client {
  # The cloud fingerprinters are useless off-cloud, slow start-up, and the
  # AWS one stops the agent when AWS_CA_BUNDLE is set (see ENVIRONMENT.md).
  options = {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }%s%s
  # The exec driver's chroot: the tasks' programs only (taskChroot, or
  # Options.Chroot).
%s}
`, level, ports[0], ports[1], ports[2], clientNetwork(opts), clientConfig(opts), chroot)
	if opts.ServerConfig != "" && opts.Join == "" {
		fmt.Fprintf(&b, "\nserver {\n  %s\n}\n", strings.ReplaceAll(strings.TrimSpace(opts.ServerConfig), "\n", "\n  "))
	}
	if opts.ACL {
		b.WriteString("\nacl {\n  enabled = true\n}\n")
	}
	if opts.Join != "" {
		// Outside -dev, Nomad will not advertise a loopback address on
		// its own.
		b.WriteString("\nadvertise {\n  http = \"127.0.0.1\"\n  rpc  = \"127.0.0.1\"\n  serf = \"127.0.0.1\"\n}\n")
	}
	if opts.PluginConfig != "" {
		b.WriteString("\n" + opts.PluginConfig + "\n")
	}
	return b.String()
}

// clientNetwork is what a client-only agent (Options.Join) needs beyond
// -dev's defaults: outside -dev, Nomad fingerprints the interface of the
// default route, and a machine without one (the OpenZFS VM has no
// network) stops the agent with "No default interface found".
func clientNetwork(opts Options) string {
	if opts.Join == "" {
		return ""
	}
	return "\n  network_interface = \"lo\""
}

// clientConfig is Options.ClientConfig, on a line of its own in the
// client block.
func clientConfig(opts Options) string {
	if opts.ClientConfig == "" {
		return ""
	}
	return "\n  " + opts.ClientConfig
}

// waitReady waits until the API answers, bootstraps ACLs when asked, and
// waits until the agent's own node is ready, or until ctx is done.
func (a *Agent) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	var last error
	poll := func(what string, fn func() error) error {
		for {
			select {
			case <-a.exited:
				return fmt.Errorf("agent exited while waiting for %s: %v", what, a.exitErr)
			case <-ctx.Done():
				return ctx.Err()
			default:
			}
			if last = fn(); last == nil {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("timed out after %s waiting for %s: %v", startTimeout, what, last)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	if err := poll("a leader", func() error {
		leader, err := a.API.Status().Leader()
		if err == nil && leader == "" {
			err = errors.New("no leader yet")
		}
		return err
	}); err != nil {
		return err
	}
	if a.Token != "" {
		// Bootstrap with the secret chosen before start, which the agent's
		// environment (and so its plugins) already has.
		if err := poll("ACL bootstrap", func() error {
			tok, _, err := a.API.ACLTokens().BootstrapOpts(a.Token, nil)
			if err != nil {
				return err
			}
			if tok.SecretID != a.Token {
				return fmt.Errorf("bootstrap returned another secret")
			}
			a.API.SetSecretID(a.Token)
			return nil
		}); err != nil {
			return err
		}
	}
	if err := poll("the client node ID", func() error {
		self, err := a.API.Agent().Self()
		if err != nil {
			return err
		}
		id := self.Stats["client"]["node_id"]
		if id == "" {
			return errors.New("agent reports no client node_id yet")
		}
		a.NodeID = id
		return nil
	}); err != nil {
		return err
	}
	return poll("the node to be ready", func() error {
		node, _, err := a.API.Nodes().Info(a.NodeID, nil)
		if err != nil {
			return err
		}
		if node.Status != api.NodeStatusReady {
			return fmt.Errorf("node %s is %s", a.NodeID, node.Status)
		}
		return nil
	})
}

// Stop sends SIGINT to the agent's PID, waits up to Options.StopTimeout (90 s
// when zero) for it to exit, and then sends SIGKILL to it and to the
// processes it started (its plugins and task executors, found by parent
// PID). Calling it again returns the first result.
func (a *Agent) Stop() error {
	a.stopOnce.Do(func() {
		if a.cmd == nil || a.cmd.Process == nil {
			return
		}
		select {
		case <-a.exited:
			return
		default:
		}
		// A client-only agent leaves its tasks running when it stops (a
		// dev agent stops them): they go by the PIDs recorded now.
		var tasks []int
		if a.join {
			tasks = localagent.Descendants(a.PID)
		}
		_ = a.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-a.exited:
			for _, pid := range tasks {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		case <-time.After(a.stopTimeout):
		}
		children := localagent.Descendants(a.PID)
		_ = a.cmd.Process.Kill()
		for _, pid := range children {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		<-a.exited
		a.stopErr = fmt.Errorf("agent did not exit within %s of SIGINT; killed it and %d descendants", a.stopTimeout, len(children))
	})
	return a.stopErr
}

// Abandon stops the agent process alone, as a node that is lost: SIGINT to
// its PID, then SIGKILL to it alone once Options.StopTimeout has passed. It
// leaves the processes the agent started: a client's tasks (and their
// executors) go on running, and so does a plugin that outlives its agent.
// It returns their PIDs as they were at the SIGINT, for the caller to end;
// Stop then does nothing.
func (a *Agent) Abandon() ([]int, error) {
	var left []int
	a.stopOnce.Do(func() {
		if a.cmd == nil || a.cmd.Process == nil || a.Exited() {
			return
		}
		left = localagent.Descendants(a.PID)
		_ = a.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-a.exited:
			return
		case <-time.After(a.stopTimeout):
		}
		_ = a.cmd.Process.Kill()
		<-a.exited
		a.stopErr = fmt.Errorf("agent did not exit within %s of SIGINT; killed it (not its %d descendants)", a.stopTimeout, len(left))
	})
	return left, a.stopErr
}

// Exited reports whether the agent process has exited.
func (a *Agent) Exited() bool {
	select {
	case <-a.exited:
		return true
	default:
		return false
	}
}

// LogTail returns the last n lines of the agent log.
func (a *Agent) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(a.logText(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// schedulerLines returns the last n lines of the agent log that trace an
// evaluation through the server (its workers, the plan applier, which logs
// as "nomad:", and the other "nomad." parts) and the HTTP DELETE requests
// that start one (a deregistration): a failed test's tail may start after
// the evaluation that matters.
func (a *Agent) schedulerLines(n int) string {
	var lines []string
	for _, line := range strings.Split(a.logText(), "\n") {
		server := strings.Contains(line, "worker") || strings.Contains(line, " nomad: ") || strings.Contains(line, " nomad.")
		if (strings.Contains(line, "eval") && server) || strings.Contains(line, "method=DELETE") {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (a *Agent) logText() string {
	b, err := os.ReadFile(a.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", a.LogPath, err)
	}
	return string(b)
}

// Node returns the agent's node as the API has it now.
func (a *Agent) Node(t testing.TB) *api.Node {
	t.Helper()
	node, _, err := a.API.Nodes().Info(a.NodeID, nil)
	must.NoError(t, err, must.Sprintf("reading node %s", a.NodeID))
	return node
}

// agentEnv is environ without NOMAD_* variables, plus NOMAD_ADDR=addr.
func agentEnv(environ []string, addr string) []string {
	var env []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "NOMAD_") {
			env = append(env, kv)
		}
	}
	return append(env, "NOMAD_ADDR="+addr)
}

// pathFirst is env with dir put first on its PATH.
func pathFirst(env []string, dir string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv = "PATH=" + dir + ":" + path
		}
		out[i] = kv
	}
	return out
}

// newUUID returns a random (version 4) UUID, the form Nomad wants for ACL
// secrets.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
