package agentconfig_test

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/agentconfig"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
)

func TestLoad(t *testing.T) {
	cases := []struct {
		name       string
		paths      []string
		files      int
		pluginDir  string
		blocks     int
		parent     string   // of the merged block, through the plugin's own validation
		classNames []string // of the merged block
		errHas     string   // Load's error
	}{
		{
			name:  "the example agent configuration",
			paths: []string{"../../examples/agent.hcl"}, files: 1, blocks: 1,
			parent: "tank/nomad", classNames: []string{"scratch"},
		},
		{
			name:  "a directory: hcl and json in lexical order, other files skipped",
			paths: []string{"testdata/dir"}, files: 2, blocks: 1, pluginDir: "/opt/nomad/plugins",
			parent: "tank/json", classNames: []string{"fast"},
		},
		{
			name:  "data_dir alone gives <data_dir>/plugins",
			paths: []string{"testdata/dir/10-agent.hcl"}, files: 1, pluginDir: "/opt/nomad/data/plugins",
		},
		{
			name:  "two blocks: the later config wins, as in Nomad",
			paths: []string{"testdata/two-blocks.hcl"}, files: 1, blocks: 2,
			parent: "tank/two", classNames: []string{"b"},
		},
		{name: "a missing path", paths: []string{"testdata/nope.hcl"}, errHas: "testdata/nope.hcl"},
		{name: "an HCL syntax error names the file", paths: []string{"testdata/broken.hcl"}, errHas: "testdata/broken.hcl"},
		{name: "no path", errHas: "-config PATH"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := agentconfig.Load(tc.paths)
			if tc.errHas != "" {
				must.ErrorContains(t, err, tc.errHas)
				return
			}
			must.NoError(t, err)
			must.Len(t, tc.files, a.Files)
			must.Eq(t, tc.pluginDir, a.EffectivePluginDir())
			must.Len(t, tc.blocks, a.Blocks(config.PluginName))
			p, ok := a.Plugin(config.PluginName)
			must.Eq(t, tc.blocks > 0, ok)
			if !ok {
				return
			}
			s, err := config.FromAgent(p.Config)
			must.NoError(t, err)
			must.Eq(t, tc.parent, s.Slots.Parent)
			var names []string
			for _, c := range s.Slots.Classes {
				names = append(names, c.Name)
			}
			must.Eq(t, tc.classNames, names)
		})
	}
}

// The CLI reads the block through the plugin's schema and validation:
// defaults apply and bad values fail with the errors SetConfig gives.
func TestSettingsFromAgentConfig(t *testing.T) {
	a, err := agentconfig.Load([]string{"../../examples/agent.hcl"})
	must.NoError(t, err)
	p, _ := a.Plugin(config.PluginName)
	s, err := config.FromAgent(p.Config)
	must.NoError(t, err)
	must.Eq(t, "2m0s", s.ReserveTimeout.String())
	c := s.Slots.Classes[0]
	must.Eq(t, 2, c.Slots)
	must.Eq(t, uint64(64<<20), c.Quota)
	must.Eq(t, "/zfs/scratch", c.MountPath)
	must.Eq(t, map[string]string{"compression": "on", "atime": "off"}, c.Properties)

	bad, err := agentconfig.Load([]string{"testdata/badclass.hcl"})
	must.NoError(t, err)
	p, _ = bad.Plugin(config.PluginName)
	_, err = config.FromAgent(p.Config)
	must.ErrorContains(t, err, `class "scratch": quota = "10Q"`)

	_, err = config.FromAgent(nil)
	must.Error(t, err)
	must.True(t, strings.Contains(err.Error(), "parent_dataset"), must.Sprint(err))
}
