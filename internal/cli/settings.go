package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/agentconfig"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Why the settings could not be loaded, for doctor's advice.
var (
	// errParentFlag: -parent disagrees with the configuration, or is no
	// dataset name.
	errParentFlag = errors.New("-parent")
	// errFlag: another flag's value is wrong.
	errFlag = errors.New("bad flag")
	// errClassesFromZFS: without -config, the classes could not be read
	// from ZFS under -parent.
	errClassesFromZFS = errors.New("reading the classes from ZFS")
)

// nodeIDRE is the shape of a Nomad node ID (a UUID).
var nodeIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// common are the flags every operator command takes.
type common struct {
	configs  stringList
	parent   string
	address  string
	token    string
	nodeID   string
	jsonOut  bool
	timeout  string
	deadline time.Duration // -timeout, parsed
	settings config.Settings
	agent    *agentconfig.Agent // nil without -config
	fromZFS  bool               // the classes were read from ZFS (-parent without -config)
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

const commonHelp = `
Where the settings come from:

  -config=<path>
    A Nomad agent configuration file or directory, as given to
    "nomad agent -config"; may be repeated. The plugin "nomad-device-zfs"
    block in it gives the parent dataset, the classes and the nomad block.

  -parent=<dataset>
    Without -config: the plugin's parent dataset. The classes are then read
    from the datasets the plugin made under it.

  -address=<addr>, -token=<secret>, -node-id=<id>
    Override the nomad block's address, token and node_id (which otherwise
    fall back to NOMAD_ADDR, NOMAD_TOKEN and the local agent, as the plugin
    does).

  -json
    Print the result as JSON.

  -timeout=<duration>
    Give up on ZFS and Nomad after this long. Default: 30s.
`

func (c *common) register(fs *flag.FlagSet) {
	fs.Var(&c.configs, "config", "agent configuration file or directory (repeatable)")
	fs.StringVar(&c.parent, "parent", "", "the parent dataset, without -config")
	fs.StringVar(&c.address, "address", "", "Nomad API address (overrides the nomad block)")
	fs.StringVar(&c.token, "token", "", "Nomad ACL token (overrides the nomad block)")
	fs.StringVar(&c.nodeID, "node-id", "", "Nomad node ID (overrides the nomad block)")
	fs.BoolVar(&c.jsonOut, "json", false, "print JSON")
	fs.StringVar(&c.timeout, "timeout", "30s", "deadline for ZFS and Nomad")
}

// load resolves the settings: from -config, else from -parent and what
// ZFS holds under it. Flags override the nomad block.
func (c *common) load(ctx context.Context, z *zfs.Client) error {
	if c.address != "" {
		if err := config.ValidateNomadAddress(c.address); err != nil {
			return fmt.Errorf("%w: -address=%s: %w", errFlag, c.address, err)
		}
	}
	if c.nodeID != "" && !nodeIDRE.MatchString(c.nodeID) {
		return fmt.Errorf("%w: -node-id=%s: want a node ID such as 5e1c0a3d-8f2b-4c41-9a55-2b7f6c0f9e11 (nomad node status)", errFlag, c.nodeID)
	}
	switch {
	case len(c.configs) > 0:
		a, err := agentconfig.Load(c.configs)
		if err != nil {
			return err
		}
		c.agent = a
		p, ok := a.Plugin(config.PluginName)
		if !ok {
			return fmt.Errorf("no plugin %q block in %s", config.PluginName, strings.Join(a.Files, ", "))
		}
		if c.settings, err = config.FromAgent(p.Config); err != nil {
			return fmt.Errorf("%s: %w", p.File, err)
		}
		if c.parent != "" && c.parent != c.settings.Slots.Parent {
			return fmt.Errorf("%w=%s differs from parent_dataset %q in %s", errParentFlag, c.parent, c.settings.Slots.Parent, p.File)
		}
	case c.parent != "":
		if err := zfs.ValidateDatasetName(c.parent); err != nil {
			return fmt.Errorf("%w=%s: %w", errParentFlag, c.parent, err)
		}
		cfg, err := classesFromZFS(ctx, z, c.parent)
		if err != nil {
			return err
		}
		c.settings.Slots, c.fromZFS = cfg, true
	default:
		return errors.New("give -config=<agent configuration> (or -parent=<dataset>)")
	}
	if c.address != "" {
		c.settings.Nomad.Address = c.address
	}
	if c.nodeID != "" {
		c.settings.Nomad.NodeID = c.nodeID
	}
	if c.token != "" {
		c.settings.Nomad.Token, c.settings.Nomad.TokenFile = c.token, ""
	}
	return nil
}

// classesFromZFS rebuilds the classes from what the plugin made under
// parent: each class container, with as many slots as its highest slot
// index and the quota its slots carry. Enough to show the slots when the
// agent's configuration is not at hand.
func classesFromZFS(ctx context.Context, z *zfs.Client, parent string) (slots.Config, error) {
	cfg := slots.Config{Parent: parent}
	ds, err := z.Get(ctx, parent, 2, "refquota", record.PropManaged)
	if err != nil {
		return cfg, fmt.Errorf("%w under %s: %w", errClassesFromZFS, parent, err)
	}
	classes := map[string]*slots.Class{}
	for _, d := range ds {
		rel, ok := strings.CutPrefix(d.Name, parent+"/")
		if !ok || d.Err != nil {
			continue
		}
		first, rest, nested := strings.Cut(rel, "/")
		managed, _ := d.Local(record.PropManaged)
		switch {
		case !nested && managed == record.ManagedClass:
			if classes[first] == nil {
				classes[first] = &slots.Class{Name: first}
			}
		case nested && managed == record.ManagedSlot && !strings.HasPrefix(first, "."):
			idx, _ := record.SlotIndex(rest)
			if idx < 0 || idx >= config.MaxSlots {
				continue
			}
			c := classes[first]
			if c == nil {
				c = &slots.Class{Name: first}
				classes[first] = c
			}
			c.Slots = max(c.Slots, idx+1)
			if q, err := d.Bytes("refquota"); err == nil && q > 0 {
				c.Quota = q
			}
		}
	}
	names := make([]string, 0, len(classes))
	for n := range classes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		cfg.Classes = append(cfg.Classes, *classes[n])
	}
	if len(cfg.Classes) == 0 {
		return cfg, fmt.Errorf("%w: no class of nomad-device-zfs under %s: is it the plugin's parent_dataset?", errClassesFromZFS, parent)
	}
	return cfg, nil
}
