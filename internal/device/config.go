package device

import (
	"fmt"
	"os"
	"os/user"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Defaults for optional configuration fields.
const (
	DefaultFingerprintPeriod = "30s"
	DefaultStatsPeriod       = "10s"
	DefaultOwner             = "65534:65534"
	DefaultMode              = "0770"
)

// configSpec is the agent-side schema of the plugin block. Nomad parses agent
// configuration as HCL1, which turns `properties = { ... }` into a list of
// objects: properties is therefore a block of attributes (BlockAttrs), which
// accepts both `properties { ... }` and `properties = { ... }`, and class is
// a labelled block map.
var configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"parent_dataset": hclspec.NewAttr("parent_dataset", "string", true),
	"fingerprint_period": hclspec.NewDefault(
		hclspec.NewAttr("fingerprint_period", "string", false),
		hclspec.NewLiteral(strconv.Quote(DefaultFingerprintPeriod)),
	),
	"stats_period": hclspec.NewDefault(
		hclspec.NewAttr("stats_period", "string", false),
		hclspec.NewLiteral(strconv.Quote(DefaultStatsPeriod)),
	),
	"class": hclspec.NewBlockMap("class", []string{"name"}, hclspec.NewObject(map[string]*hclspec.Spec{
		"slots":      hclspec.NewAttr("slots", "number", true),
		"quota":      hclspec.NewAttr("quota", "string", true),
		"mount_path": hclspec.NewAttr("mount_path", "string", false),
		"read_only": hclspec.NewDefault(
			hclspec.NewAttr("read_only", "bool", false),
			hclspec.NewLiteral("false"),
		),
		"owner": hclspec.NewDefault(
			hclspec.NewAttr("owner", "string", false),
			hclspec.NewLiteral(strconv.Quote(DefaultOwner)),
		),
		"mode": hclspec.NewDefault(
			hclspec.NewAttr("mode", "string", false),
			hclspec.NewLiteral(strconv.Quote(DefaultMode)),
		),
		"properties": hclspec.NewBlockAttrs("properties", "string", false),
	})),
})

// Config is the plugin block as Nomad sends it (msgpack-encoded).
type Config struct {
	ParentDataset     string                 `codec:"parent_dataset"`
	FingerprintPeriod string                 `codec:"fingerprint_period"`
	StatsPeriod       string                 `codec:"stats_period"`
	Classes           map[string]ClassConfig `codec:"class"`
}

// ClassConfig is one `class "name" { ... }` block.
type ClassConfig struct {
	Slots      int               `codec:"slots"`
	Quota      string            `codec:"quota"`
	MountPath  string            `codec:"mount_path"`
	ReadOnly   bool              `codec:"read_only"`
	Owner      string            `codec:"owner"`
	Mode       string            `codec:"mode"`
	Properties map[string]string `codec:"properties"`
}

// settings is a validated configuration.
type settings struct {
	slots             slots.Config
	fingerprintPeriod time.Duration
	statsPeriod       time.Duration
}

var classNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// propertyNameRE accepts native property names and user properties
// (module:property).
var propertyNameRE = regexp.MustCompile(`^[a-z][a-z0-9_.:-]*$`)

// forbiddenProps may not be set through a class's properties: the plugin
// owns where datasets mount and how big they are.
var forbiddenProps = map[string]string{
	"mountpoint": "the plugin mounts datasets under the parent dataset",
	"canmount":   "the plugin mounts every slot",
	"quota":      "use the class quota",
	"refquota":   "use the class quota",
}

// decodeConfig decodes the msgpack bytes Nomad sends to SetConfig.
func decodeConfig(b []byte, c *Config) error {
	if len(b) == 0 {
		return fmt.Errorf("nomad-device-zfs config: the plugin block has no config: parent_dataset and a class are required")
	}
	if err := base.MsgPackDecode(b, c); err != nil {
		return fmt.Errorf("nomad-device-zfs config: decoding: %w", err)
	}
	return nil
}

// validate checks every field and returns the first problem, naming the
// field and the value. It reads the host only to look up owner names.
func (c *Config) validate() (settings, error) {
	var s settings
	if c.ParentDataset == "" {
		return s, fmt.Errorf("parent_dataset is required")
	}
	if err := zfs.ValidateDatasetName(c.ParentDataset); err != nil {
		return s, fmt.Errorf("parent_dataset %q: %w", c.ParentDataset, err)
	}
	var err error
	if s.fingerprintPeriod, err = positiveDuration("fingerprint_period", c.FingerprintPeriod, DefaultFingerprintPeriod); err != nil {
		return s, err
	}
	if s.statsPeriod, err = positiveDuration("stats_period", c.StatsPeriod, DefaultStatsPeriod); err != nil {
		return s, err
	}
	if len(c.Classes) == 0 {
		return s, fmt.Errorf("at least one class block is required")
	}
	s.slots.Parent = c.ParentDataset
	names := make([]string, 0, len(c.Classes))
	for name := range c.Classes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cl, err := validateClass(name, c.Classes[name])
		if err != nil {
			return s, err
		}
		s.slots.Classes = append(s.slots.Classes, cl)
	}
	return s, nil
}

func validateClass(name string, cc ClassConfig) (slots.Class, error) {
	cl := slots.Class{Name: name, Slots: cc.Slots, ReadOnly: cc.ReadOnly}
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	if !classNameRE.MatchString(name) {
		return cl, fmt.Errorf("class name %q: use lower-case letters, digits and '-', starting with a letter, at most 32 characters", name)
	}
	if cc.Slots < 0 {
		return cl, fmt.Errorf("%s = %d: must be 0 or more", field("slots"), cc.Slots)
	}
	if cc.Quota == "" {
		return cl, fmt.Errorf("%s is required", field("quota"))
	}
	q, err := zfs.ParseSize(cc.Quota)
	if err != nil {
		return cl, fmt.Errorf("%s = %q: %w", field("quota"), cc.Quota, err)
	}
	cl.Quota = q

	cl.MountPath = cc.MountPath
	if cl.MountPath == "" {
		cl.MountPath = "/zfs/" + name
	}
	if !path.IsAbs(cl.MountPath) || path.Clean(cl.MountPath) != cl.MountPath || cl.MountPath == "/" {
		return cl, fmt.Errorf("%s = %q: must be an absolute, clean path other than /, such as /zfs/%s", field("mount_path"), cc.MountPath, name)
	}

	owner := cc.Owner
	if owner == "" {
		owner = DefaultOwner
	}
	if cl.UID, cl.GID, err = parseOwner(owner); err != nil {
		return cl, fmt.Errorf("%s = %q: %w", field("owner"), owner, err)
	}
	mode := cc.Mode
	if mode == "" {
		mode = DefaultMode
	}
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o777 {
		return cl, fmt.Errorf("%s = %q: want octal permission bits from 0000 to 0777, such as \"0770\"", field("mode"), mode)
	}
	cl.Mode = os.FileMode(m)

	cl.Properties = make(map[string]string, len(cc.Properties))
	for k, v := range cc.Properties {
		switch {
		case forbiddenProps[k] != "":
			return cl, fmt.Errorf("%s: %q may not be set: %s", field("properties"), k, forbiddenProps[k])
		case strings.HasPrefix(k, "nomad-device-zfs:"):
			return cl, fmt.Errorf("%s: %q may not be set: the plugin's own properties are reserved", field("properties"), k)
		case !propertyNameRE.MatchString(k):
			return cl, fmt.Errorf("%s: %q is not a valid ZFS property name", field("properties"), k)
		case v == "" || strings.ContainsAny(v, "\x00\n"):
			return cl, fmt.Errorf("%s: %s = %q: value must be non-empty and on one line", field("properties"), k, v)
		}
		cl.Properties[k] = v
	}
	return cl, nil
}

// parseOwner reads "uid:gid", where each side is a number or a name on the host.
func parseOwner(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	if !ok || u == "" || g == "" {
		return 0, 0, fmt.Errorf("want uid:gid, such as \"65534:65534\" or \"nobody:nogroup\"")
	}
	if uid, err = strconv.Atoi(u); err != nil {
		usr, lerr := user.Lookup(u)
		if lerr != nil {
			return 0, 0, fmt.Errorf("user %q: %w", u, lerr)
		}
		uid, _ = strconv.Atoi(usr.Uid)
	}
	if gid, err = strconv.Atoi(g); err != nil {
		grp, lerr := user.LookupGroup(g)
		if lerr != nil {
			return 0, 0, fmt.Errorf("group %q: %w", g, lerr)
		}
		gid, _ = strconv.Atoi(grp.Gid)
	}
	if uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("uid and gid must not be negative")
	}
	return uid, gid, nil
}

func positiveDuration(field, value, def string) (time.Duration, error) {
	if value == "" {
		value = def
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, fmt.Errorf("%s = %q: not a duration (use a value such as %q)", field, value, def)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s = %q: must be greater than zero", field, value)
	}
	return d, nil
}
