// Package agentconfig reads what the operator CLI needs from a Nomad agent's
// configuration: the plugin blocks, plugin_dir and data_dir. It takes
// paths as `nomad agent -config` does (files or directories; in a
// directory, its *.hcl and *.json files in lexical order) and decodes
// them with the HCL 1 parser Nomad uses, so a block reads here as it
// reads to the agent.
package agentconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl"
)

// Agent is what the configuration files say, merged as Nomad merges them.
type Agent struct {
	// Files are the files read, in the order read.
	Files []string
	// DataDir and PluginDir are the last values set (Nomad's merge);
	// empty when unset.
	DataDir   string
	PluginDir string
	// Plugins lists every plugin block, in the order read.
	Plugins []Plugin
}

// Plugin is one `plugin "NAME" { … }` block.
type Plugin struct {
	Name   string
	File   string
	Args   []string
	Config map[string]interface{}
}

// fileConfig is the part of one agent configuration file that is read.
// Unknown keys are ignored: the agent judges those.
type fileConfig struct {
	DataDir   string        `hcl:"data_dir"`
	PluginDir string        `hcl:"plugin_dir"`
	Plugins   []pluginBlock `hcl:"plugin"`
}

type pluginBlock struct {
	Name   string                 `hcl:",key"`
	Args   []string               `hcl:"args"`
	Config map[string]interface{} `hcl:"config"`
}

// Load reads the agent configuration at paths (files or directories). An
// error names the file and what is wrong with it; a path that holds no
// configuration file is an error too, since the operator meant it to.
func Load(paths []string) (*Agent, error) {
	if len(paths) == 0 {
		return nil, errors.New("no agent configuration given: use -config PATH (a file or a directory, as for nomad agent)")
	}
	a := &Agent{}
	for _, p := range paths {
		files, err := filesOf(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if err := a.read(f); err != nil {
				return nil, err
			}
		}
	}
	return a, nil
}

// filesOf lists the configuration files a path stands for, as Nomad does:
// the file itself, or a directory's *.hcl and *.json files (not
// subdirectories, not editors' temporary files), sorted.
func filesOf(p string) ([]string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("agent configuration %s: %w", p, err)
	}
	if !fi.IsDir() {
		return []string{filepath.Clean(p)}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, fmt.Errorf("agent configuration directory %s: %w", p, err)
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || isTemporary(name) || !(strings.HasSuffix(name, ".hcl") || strings.HasSuffix(name, ".json")) {
			continue
		}
		files = append(files, filepath.Join(p, name))
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("agent configuration directory %s holds no .hcl or .json file", p)
	}
	sort.Strings(files)
	return files, nil
}

// isTemporary matches the editor files Nomad's LoadConfigDir skips.
func isTemporary(name string) bool {
	return strings.HasSuffix(name, "~") || (strings.HasPrefix(name, ".#") || (strings.HasPrefix(name, "#") && strings.HasSuffix(name, "#")))
}

func (a *Agent) read(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("agent configuration %s: %w", file, err)
	}
	var fc fileConfig
	if err := hcl.Decode(&fc, string(b)); err != nil {
		return fmt.Errorf("agent configuration %s: %w", file, err)
	}
	a.Files = append(a.Files, file)
	if fc.DataDir != "" {
		a.DataDir = fc.DataDir
	}
	if fc.PluginDir != "" {
		a.PluginDir = fc.PluginDir
	}
	for _, p := range fc.Plugins {
		a.Plugins = append(a.Plugins, Plugin{Name: p.Name, File: file, Args: p.Args, Config: p.Config})
	}
	return nil
}

// Blocks returns the plugin blocks named name, in the order read.
func (a *Agent) Blocks(name string) []Plugin {
	var out []Plugin
	for _, p := range a.Plugins {
		if p.Name == name {
			out = append(out, p)
		}
	}
	return out
}

// Plugin returns the configuration Nomad gives plugin name: with several
// blocks, each later block's non-empty config replaces the earlier one
// (Nomad's merge). ok is false when there is no block.
func (a *Agent) Plugin(name string) (p Plugin, ok bool) {
	for _, b := range a.Blocks(name) {
		if !ok {
			p, ok = b, true
			continue
		}
		if len(b.Args) != 0 {
			p.Args = b.Args
		}
		if len(b.Config) != 0 {
			p.Config, p.File = b.Config, b.File
		}
	}
	return p, ok
}

// EffectivePluginDir is where the agent looks for plugin binaries:
// plugin_dir, else <data_dir>/plugins; "" when neither is set.
func (a *Agent) EffectivePluginDir() string {
	switch {
	case a.PluginDir != "":
		return a.PluginDir
	case a.DataDir != "":
		return filepath.Join(a.DataDir, "plugins")
	}
	return ""
}

// ParseConfig decodes the HCL of one `config { … }` block, as the agent's
// parser reads it inside a plugin block, into the form Plugin.Config has.
// The tests and the benchmarks write plugin configurations so. A text
// without a config block is an empty block, as for the agent.
func ParseConfig(text string) (map[string]interface{}, error) {
	var block struct {
		Config map[string]interface{} `hcl:"config"`
	}
	if err := hcl.Decode(&block, text); err != nil {
		return nil, fmt.Errorf("parsing the config block: %w", err)
	}
	if block.Config == nil {
		return map[string]interface{}{}, nil
	}
	return block.Config, nil
}
