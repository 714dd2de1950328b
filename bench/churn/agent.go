package churn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench/nulldevice"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/localagent"
)

// The churn scenario runs a real Nomad agent. This file starts one outside
// tests (the tests' starter, internal/nomadtest, takes a testing.TB): a
// dev-mode agent on free loopback ports, with the plugin in its plugin
// directory, stopped by its PID.

const (
	agentStartTimeout = 2 * time.Minute
	agentStopTimeout  = 30 * time.Second
)

// NomadBinary returns the pinned Nomad binary: $NOMAD_BIN when set, else
// the one scripts/build-nomad.sh (and the tests) cache for the version that
// e2e/nomad/go.mod requires. It does not build Nomad; the error says how.
func NomadBinary() (string, error) {
	if bin := os.Getenv("NOMAD_BIN"); bin != "" {
		return bin, localagent.CheckExecutable(bin)
	}
	root, err := localagent.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("finding the pinned Nomad version (run inside the repository): %w", err)
	}
	version, err := localagent.PinnedVersionOf(root)
	if err != nil {
		return "", fmt.Errorf("finding the pinned Nomad version: %w", err)
	}
	bin, err := localagent.CachedBinaryPath(version)
	if err != nil {
		return "", err
	}
	if err := localagent.CheckExecutable(bin); err != nil {
		return "", fmt.Errorf("no Nomad %s at %s (build it with scripts/build-nomad.sh): %w", version, bin, err)
	}
	return bin, nil
}

// agentSpec configures startAgent.
type agentSpec struct {
	Nomad     string   // the nomad binary
	Dir       string   // holds agent.hcl, agent.log, data/ and plugins/
	PluginBin string   // copied into Dir/plugins as nomad-device-zfs
	NullBin   string   // when set, copied into Dir/plugins as nomad-device-null
	Config    string   // HCL appended to the agent configuration
	PathFirst string   // a directory put first on the agent's PATH
	Env       []string // the environment before NOMAD_* is removed
}

// agent is a running dev-mode Nomad agent.
type agent struct {
	Addr      string
	API       *api.Client
	NodeID    string
	PID       int
	LogPath   string
	PluginBin string // the copy the agent launches

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // set before exited is closed
}

// startAgent starts `nomad agent -dev` as spec says and returns once its
// node is ready. On error no agent is left running.
func startAgent(ctx context.Context, spec agentSpec) (*agent, error) {
	pluginDir := filepath.Join(spec.Dir, "plugins")
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return nil, err
	}
	a := &agent{LogPath: filepath.Join(spec.Dir, "agent.log"), PluginBin: filepath.Join(pluginDir, "nomad-device-zfs"), exited: make(chan struct{})}
	if err := copyFile(spec.PluginBin, a.PluginBin, 0o755); err != nil {
		return nil, err
	}
	if spec.NullBin != "" {
		if err := copyFile(spec.NullBin, filepath.Join(pluginDir, nulldevice.PluginName), 0o755); err != nil {
			return nil, err
		}
	}
	ports, err := localagent.FreeLoopbackPorts(3)
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`# Written by the nomad-device-zfs churn benchmark.
log_level            = "TRACE"
disable_update_check = true
ports {
  http = %d
  rpc  = %d
  serf = %d
}
%s
`, ports[0], ports[1], ports[2], spec.Config)
	cfgPath := filepath.Join(spec.Dir, "agent.hcl")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(a.LogPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	a.Addr = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	a.cmd = exec.Command(spec.Nomad, "agent", "-dev", "-bind", "127.0.0.1",
		"-data-dir", filepath.Join(spec.Dir, "data"), "-plugin-dir", pluginDir, "-config", cfgPath)
	var env []string
	for _, kv := range spec.Env {
		switch {
		case strings.HasPrefix(kv, "NOMAD_"):
		case strings.HasPrefix(kv, "PATH=") && spec.PathFirst != "":
			env = append(env, "PATH="+spec.PathFirst+":"+strings.TrimPrefix(kv, "PATH="))
		default:
			env = append(env, kv)
		}
	}
	a.cmd.Env = append(env, "NOMAD_ADDR="+a.Addr)
	a.cmd.Dir = spec.Dir
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGINT}
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Nomad, err)
	}
	a.PID = a.cmd.Process.Pid
	go func() {
		a.err = a.cmd.Wait()
		close(a.exited)
	}()
	if a.API, err = api.NewClient(&api.Config{Address: a.Addr, TLSConfig: &api.TLSConfig{}}); err == nil {
		err = a.waitReady(ctx)
	}
	if err != nil {
		_ = a.Stop()
		return nil, fmt.Errorf("nomad agent (log %s): %w", a.LogPath, err)
	}
	return a, nil
}

// waitReady returns once the agent's own node is ready.
func (a *agent) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(agentStartTimeout)
	var last error
	for {
		select {
		case <-a.exited:
			return fmt.Errorf("agent exited: %v", a.err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if last = a.nodeReady(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", agentStartTimeout, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (a *agent) nodeReady() error {
	if a.NodeID == "" {
		self, err := a.API.Agent().Self()
		if err != nil {
			return err
		}
		if a.NodeID = self.Stats["client"]["node_id"]; a.NodeID == "" {
			return errors.New("no client node ID yet")
		}
	}
	node, _, err := a.API.Nodes().Info(a.NodeID, nil)
	if err != nil {
		return err
	}
	if node.Status != api.NodeStatusReady {
		return fmt.Errorf("node %s is %s", a.NodeID, node.Status)
	}
	return nil
}

// Stop sends SIGINT to the agent, waits up to 30 s, then kills it and the
// processes it started (found by parent PID). It returns once the agent has
// exited.
func (a *agent) Stop() error {
	select {
	case <-a.exited:
		return nil
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-a.exited:
		return nil
	case <-time.After(agentStopTimeout):
	}
	children := localagent.Descendants(a.PID)
	_ = a.cmd.Process.Kill()
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-a.exited
	return fmt.Errorf("agent did not exit within %s of SIGINT; killed it and %d descendants", agentStopTimeout, len(children))
}

// pluginPID returns the PID of the agent's child whose executable is the
// plugin binary.
func (a *agent) pluginPID() (int, error) {
	want, err := filepath.EvalSymlinks(a.PluginBin)
	if err != nil {
		return 0, err
	}
	for _, pid := range localagent.Descendants(a.PID) {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err == nil && exe == want {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process of %s under the agent (pid %d)", want, a.PID)
}

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, mode)
}

// procStatusBytes reads one "Vm…: N kB" field of /proc/PID/status, in bytes.
func procStatusBytes(pid int, field string) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("unexpected %s line %q", field, l)
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
