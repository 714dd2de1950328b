package churn

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench/nulldevice"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
)

// The churn scenario runs a real Nomad agent, started by the tests'
// starter (nomadtest.Start): a dev-mode agent on free loopback ports, with
// the plugin in its plugin directory, stopped by its PID. This file holds
// what the scenario needs around it: the pinned binary, the plugin
// directory, the plugin's process.

// pluginName is the plugin's file name in the agent's plugin directory.
const pluginName = "nomad-device-zfs"

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

// plugins makes the agent's plugin directory, dir/plugins, with a copy of
// o.PluginBin as nomad-device-zfs and, when o.NullBin is set, one of it as
// nomad-device-null, and returns its path.
func plugins(dir string, o Options) (string, error) {
	pluginDir, err := PluginDir(dir, o.PluginBin)
	if err != nil {
		return "", err
	}
	if o.NullBin != "" {
		if err := copyFile(o.NullBin, filepath.Join(pluginDir, nulldevice.PluginName), 0o755); err != nil {
			return "", err
		}
	}
	return pluginDir, nil
}

// PluginDir makes an agent's plugin directory, dir/plugins, with a copy
// of pluginBin as nomad-device-zfs, and returns its path.
func PluginDir(dir, pluginBin string) (string, error) {
	pluginDir := filepath.Join(dir, "plugins")
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return "", err
	}
	return pluginDir, copyFile(pluginBin, filepath.Join(pluginDir, pluginName), 0o755)
}

// pluginPID returns the PID of the agent's child whose executable is the
// plugin's copy in the agent's plugin directory.
func pluginPID(a *nomadtest.Agent) (int, error) {
	want, err := filepath.EvalSymlinks(filepath.Join(a.PluginDir, pluginName))
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
