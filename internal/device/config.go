package device

import (
	"errors"
	"fmt"
	"net/url"
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

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// MaxSlots bounds a class's slots, so that every dataset name fits ZFS.
const MaxSlots = 9999

// Defaults for optional configuration fields.
const (
	DefaultFingerprintPeriod = "30s"
	DefaultStatsPeriod       = "10s"
	DefaultOwner             = "65534:65534"
	DefaultMode              = "0770"
	DefaultReserveTimeout    = "2m"
	DefaultOnRelease         = "archive"
	DefaultRestore           = "off"
	DefaultKeyDir            = "/var/lib/nomad-device-zfs/keys"
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
	"archive_quota": hclspec.NewAttr("archive_quota", "string", false),
	"key_dir":       hclspec.NewAttr("key_dir", "string", false),
	"backup_dir":    hclspec.NewAttr("backup_dir", "string", false),
	"reserve_timeout": hclspec.NewDefault(
		hclspec.NewAttr("reserve_timeout", "string", false),
		hclspec.NewLiteral(strconv.Quote(DefaultReserveTimeout)),
	),
	"nomad": hclspec.NewBlock("nomad", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"address":         hclspec.NewAttr("address", "string", false),
		"token_file":      hclspec.NewAttr("token_file", "string", false),
		"ca_file":         hclspec.NewAttr("ca_file", "string", false),
		"cert_file":       hclspec.NewAttr("cert_file", "string", false),
		"key_file":        hclspec.NewAttr("key_file", "string", false),
		"tls_server_name": hclspec.NewAttr("tls_server_name", "string", false),
		"node_id":         hclspec.NewAttr("node_id", "string", false),
	})),
	"telemetry": hclspec.NewBlock("telemetry", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"prometheus_address": hclspec.NewAttr("prometheus_address", "string", false),
	})),
	"class": hclspec.NewBlockMap("class", []string{"name"}, hclspec.NewObject(map[string]*hclspec.Spec{
		"slots":      hclspec.NewAttr("slots", "number", true),
		"quota":      hclspec.NewAttr("quota", "string", false),
		"mount_path": hclspec.NewAttr("mount_path", "string", false),
		// read_only has no default here: a shared class defaults to true,
		// an exclusive one to false (see validateClass).
		"read_only":           hclspec.NewAttr("read_only", "bool", false),
		"shared":              hclspec.NewAttr("shared", "bool", false),
		"dataset":             hclspec.NewAttr("dataset", "string", false),
		"allow_shared_writes": hclspec.NewAttr("allow_shared_writes", "bool", false),
		"source":              hclspec.NewAttr("source", "string", false),
		"encryption":          hclspec.NewAttr("encryption", "bool", false),
		"owner": hclspec.NewDefault(
			hclspec.NewAttr("owner", "string", false),
			hclspec.NewLiteral(strconv.Quote(DefaultOwner)),
		),
		"mode": hclspec.NewDefault(
			hclspec.NewAttr("mode", "string", false),
			hclspec.NewLiteral(strconv.Quote(DefaultMode)),
		),
		"properties": hclspec.NewBlockAttrs("properties", "string", false),
		// on_release has no default here: it is "archive", or "destroy"
		// for a class with a source (see validateClass).
		"on_release": hclspec.NewAttr("on_release", "string", false),
		"restore": hclspec.NewDefault(
			hclspec.NewAttr("restore", "string", false),
			hclspec.NewLiteral(strconv.Quote(DefaultRestore)),
		),
		"keep":    hclspec.NewAttr("keep", "number", false),
		"max_age": hclspec.NewAttr("max_age", "string", false),
	})),
})

// Config is the plugin block as Nomad sends it (msgpack-encoded).
type Config struct {
	ParentDataset     string `codec:"parent_dataset"`
	FingerprintPeriod string `codec:"fingerprint_period"`
	StatsPeriod       string `codec:"stats_period"`
	ReserveTimeout    string `codec:"reserve_timeout"`
	// ArchiveQuota is the quota of <parent>/.archive ("" for none).
	ArchiveQuota string `codec:"archive_quota"`
	// BackupDir is a directory every client can reach, for zfs send
	// streams of the archives of classes with restore on ("" for none).
	BackupDir string `codec:"backup_dir"`
	// KeyDir holds the keys of encrypted classes' datasets ("" for
	// DefaultKeyDir).
	KeyDir    string           `codec:"key_dir"`
	Nomad     *NomadConfig     `codec:"nomad"`
	Telemetry *TelemetryConfig `codec:"telemetry"`
	// Classes holds pointers: the msgpack decoder reuses one value for
	// every entry of a map of structs, which made classes share one
	// Properties map.
	Classes map[string]*ClassConfig `codec:"class"`
}

// NomadConfig is the `nomad { ... }` block: how the plugin reads the node's
// allocations. Empty fields fall back to NOMAD_ADDR, NOMAD_TOKEN,
// NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY and NOMAD_TLS_SERVER_NAME,
// then to the local agent.
type NomadConfig struct {
	Address       string `codec:"address"`
	TokenFile     string `codec:"token_file"`
	CAFile        string `codec:"ca_file"`
	CertFile      string `codec:"cert_file"`
	KeyFile       string `codec:"key_file"`
	TLSServerName string `codec:"tls_server_name"`
	NodeID        string `codec:"node_id"`
}

// TelemetryConfig is the `telemetry { ... }` block. Without it, or with an
// empty prometheus_address, no metrics are served.
type TelemetryConfig struct {
	// PrometheusAddress is the host:port where Prometheus metrics are
	// served, at /metrics.
	PrometheusAddress string `codec:"prometheus_address"`
}

// ClassConfig is one `class "name" { ... }` block.
type ClassConfig struct {
	Slots     int    `codec:"slots"`
	Quota     string `codec:"quota"`
	MountPath string `codec:"mount_path"`
	// ReadOnly is nil when not given: true for a shared class, false for
	// an exclusive one.
	ReadOnly *bool `codec:"read_only"`
	// Shared makes the class one operator dataset (Dataset) that Slots
	// tasks may hold at once; AllowSharedWrites lets read_only be false.
	Shared            bool   `codec:"shared"`
	Dataset           string `codec:"dataset"`
	AllowSharedWrites bool   `codec:"allow_shared_writes"`
	// Source is a snapshot that fresh slots are cloned from ("" for
	// empty datasets).
	Source string `codec:"source"`
	// Encryption gives each slot its own key (OpenZFS only).
	Encryption bool              `codec:"encryption"`
	Owner      string            `codec:"owner"`
	Mode       string            `codec:"mode"`
	Properties map[string]string `codec:"properties"`
	OnRelease  string            `codec:"on_release"`
	// Restore is "off", "best-effort" or "required".
	Restore string `codec:"restore"`
	// Keep is how many archives each identity keeps (nil: DefaultKeep).
	Keep *int `codec:"keep"`
	// MaxAge prunes archives older than this ("" for no limit).
	MaxAge string `codec:"max_age"`
}

// settings is a validated configuration.
type settings struct {
	slots             slots.Config
	fingerprintPeriod time.Duration
	statsPeriod       time.Duration
	reserveTimeout    time.Duration
	nomad             allocwatch.Config
	// metricsAddress is where Prometheus metrics are served; "" for not.
	metricsAddress string
	// retention is what the archive keeps.
	retention retention.Rules
	// backupDir is backup_dir ("" for none); backupClasses the classes
	// whose archives go there (restore on).
	backupDir     string
	backupClasses map[string]bool
	// shared are the shared classes (sorted by name); slots.Classes
	// holds the others.
	shared []shared.Class // encrypted: a class has encryption = true (key_dir is then made
	// and checked at SetConfig).
	encrypted bool
}

// MaxKeep bounds a class's keep.
const MaxKeep = 10000

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
	// Every name the plugin makes under the parent must fit ZFS: the
	// longest is a shortened archive name.
	if max := slots.MaxNameLen - len("/"+slots.ArchiveName+"/") - slots.MinArchiveLeafLen; len(c.ParentDataset) > max {
		return s, fmt.Errorf("parent_dataset %q is %d bytes long: at most %d leave room for the names of archived datasets (ZFS allows %d)",
			c.ParentDataset, len(c.ParentDataset), max, slots.MaxNameLen)
	}
	var err error
	if s.fingerprintPeriod, err = positiveDuration("fingerprint_period", c.FingerprintPeriod, DefaultFingerprintPeriod); err != nil {
		return s, err
	}
	if s.statsPeriod, err = positiveDuration("stats_period", c.StatsPeriod, DefaultStatsPeriod); err != nil {
		return s, err
	}
	if s.reserveTimeout, err = positiveDuration("reserve_timeout", c.ReserveTimeout, DefaultReserveTimeout); err != nil {
		return s, err
	}
	if s.nomad, err = c.Nomad.validate(); err != nil {
		return s, err
	}
	if s.metricsAddress, err = c.Telemetry.validate(); err != nil {
		return s, err
	}
	if len(c.Classes) == 0 {
		return s, fmt.Errorf("at least one class block is required")
	}
	s.slots.Parent = c.ParentDataset
	s.retention = retention.Rules{Classes: map[string]retention.Policy{}, Default: retention.Policy{Keep: retention.DefaultKeep}}
	names := make([]string, 0, len(c.Classes))
	for name := range c.Classes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cc := c.Classes[name]
		if cc == nil {
			return s, fmt.Errorf("class %q: empty block", name)
		}
		if cc.Shared {
			sc, err := validateShared(name, *cc, c.ParentDataset)
			if err != nil {
				return s, err
			}
			s.shared = append(s.shared, sc)
			continue
		}
		cl, err := validateClass(name, *cc, c.ParentDataset)
		if err != nil {
			return s, err
		}
		pol, err := validateRetention(name, *cc, cl)
		if err != nil {
			return s, err
		}
		s.slots.Classes = append(s.slots.Classes, cl)
		s.retention.Classes[name] = pol
		if cl.OnRelease == slots.OnReleaseArchive && cl.Quota > s.retention.Headroom {
			s.retention.Headroom = cl.Quota
		}
	}
	s.backupClasses = map[string]bool{}
	for _, cl := range s.slots.Classes {
		if cl.Restore == slots.RestoreBestEffort || cl.Restore == slots.RestoreRequired {
			s.backupClasses[cl.Name] = true
		}
	}
	encrypted := false
	for _, cl := range s.slots.Classes {
		encrypted = encrypted || cl.Encrypted
	}
	// key_dir is kept without an encrypted class too: datasets made while
	// a class was encrypted still have their keys there, removed when
	// they are destroyed.
	s.slots.KeyDir = DefaultKeyDir
	if c.KeyDir != "" {
		s.slots.KeyDir = c.KeyDir
	}
	if kd := s.slots.KeyDir; !path.IsAbs(kd) || path.Clean(kd) != kd || kd == "/" {
		return s, fmt.Errorf("key_dir = %q: must be an absolute, clean path other than /, such as %s", c.KeyDir, DefaultKeyDir)
	}
	s.encrypted = encrypted
	if c.BackupDir != "" {
		if !path.IsAbs(c.BackupDir) || path.Clean(c.BackupDir) != c.BackupDir || c.BackupDir == "/" {
			return s, fmt.Errorf("backup_dir = %q: must be an absolute, clean path other than /, such as /mnt/zfs-backups", c.BackupDir)
		}
		if len(s.backupClasses) == 0 {
			return s, fmt.Errorf("backup_dir = %q: no class has restore on, so nothing would be backed up or restored from it", c.BackupDir)
		}
		s.backupDir = c.BackupDir
	}
	if c.ArchiveQuota != "" {
		q, err := zfs.ParseSize(c.ArchiveQuota)
		if err != nil {
			return s, fmt.Errorf("archive_quota = %q: %w", c.ArchiveQuota, err)
		}
		if q == 0 {
			return s, fmt.Errorf("archive_quota = %q: must be greater than zero (leave it out for no quota)", c.ArchiveQuota)
		}
		if q < s.retention.Headroom {
			return s, fmt.Errorf("archive_quota = %q is less than the quota of a class that archives (%d bytes): no archive of that class could ever be kept; raise archive_quota or use on_release = \"destroy\"",
				c.ArchiveQuota, s.retention.Headroom)
		}
		s.retention.Quota = q
	}
	return s, nil
}

// validateRetention checks a class's keep and max_age, which apply to the
// archives of a class that archives.
func validateRetention(name string, cc ClassConfig, cl slots.Class) (retention.Policy, error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	pol := retention.Policy{Keep: retention.DefaultKeep}
	if cl.OnRelease != slots.OnReleaseArchive && (cc.Keep != nil || cc.MaxAge != "") {
		return pol, fmt.Errorf("%s: keep and max_age apply to archives, and on_release = %q keeps none", field("keep/max_age"), cl.OnRelease)
	}
	if cc.Keep != nil {
		if *cc.Keep < 1 || *cc.Keep > MaxKeep {
			return pol, fmt.Errorf("%s = %d: must be from 1 to %d (on_release = \"destroy\" keeps none)", field("keep"), *cc.Keep, MaxKeep)
		}
		pol.Keep = *cc.Keep
	}
	if cc.MaxAge != "" {
		d, err := time.ParseDuration(cc.MaxAge)
		if err != nil {
			return pol, fmt.Errorf("%s = %q: not a duration (use a value such as \"168h\")", field("max_age"), cc.MaxAge)
		}
		if d <= 0 {
			return pol, fmt.Errorf("%s = %q: must be greater than zero (leave it out for no age limit)", field("max_age"), cc.MaxAge)
		}
		pol.MaxAge = d
	}
	return pol, nil
}

// validateCommon checks what every class has: its name, slots and
// mount_path (defaulted). It returns the mount path.
func validateCommon(name string, cc ClassConfig) (string, error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	if !classNameRE.MatchString(name) {
		return "", fmt.Errorf("class name %q: use lower-case letters, digits and '-', starting with a letter, at most 32 characters", name)
	}
	if cc.Slots < 0 || cc.Slots > MaxSlots {
		return "", fmt.Errorf("%s = %d: must be from 0 to %d", field("slots"), cc.Slots, MaxSlots)
	}
	mp := cc.MountPath
	if mp == "" {
		mp = "/zfs/" + name
	}
	if !path.IsAbs(mp) || path.Clean(mp) != mp || mp == "/" {
		return "", fmt.Errorf("%s = %q: must be an absolute, clean path other than /, such as /zfs/%s", field("mount_path"), cc.MountPath, name)
	}
	return mp, nil
}

// validateShared checks a `shared = true` class. Fields that shape the
// plugin's own datasets are errors there: the plugin never writes the
// operator's dataset.
func validateShared(name string, cc ClassConfig, parent string) (shared.Class, error) {
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	mp, err := validateCommon(name, cc)
	if err != nil {
		return shared.Class{}, err
	}
	sc := shared.Class{Name: name, Dataset: cc.Dataset, Slots: cc.Slots, MountPath: mp, ReadOnly: true}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"quota", cc.Quota != ""},
		{"properties", len(cc.Properties) > 0},
		{"on_release", cc.OnRelease != ""},
		{"restore", cc.Restore != "" && cc.Restore != slots.RestoreOff},
		{"keep", cc.Keep != nil},
		{"max_age", cc.MaxAge != ""},
		{"source", cc.Source != ""},
		{"encryption", cc.Encryption},
	} {
		if f.set {
			return sc, fmt.Errorf("%s: not for a shared class (shared = true): the plugin only reads the operator's dataset, it never sizes, releases or replaces it", field(f.name))
		}
	}
	if cc.Owner != "" && cc.Owner != DefaultOwner || cc.Mode != "" && cc.Mode != DefaultMode {
		return sc, fmt.Errorf("%s: not for a shared class (shared = true): the operator's dataset keeps its own owner and mode", field("owner/mode"))
	}
	if cc.Dataset == "" {
		return sc, fmt.Errorf("%s is required for a shared class: an existing dataset the operator fills, such as \"tank/models\"", field("dataset"))
	}
	if err := zfs.ValidateDatasetName(cc.Dataset); err != nil {
		return sc, fmt.Errorf("%s = %q: %w", field("dataset"), cc.Dataset, err)
	}
	switch {
	case cc.Dataset == parent || strings.HasPrefix(cc.Dataset, parent+"/"):
		return sc, fmt.Errorf("%s = %q: is inside parent_dataset %q, which the plugin owns; a shared dataset is one the operator owns, outside it", field("dataset"), cc.Dataset, parent)
	case strings.HasPrefix(parent, cc.Dataset+"/"):
		return sc, fmt.Errorf("%s = %q: holds parent_dataset %q: every tenant's data would be visible through it", field("dataset"), cc.Dataset, parent)
	}
	if cc.ReadOnly != nil {
		sc.ReadOnly = *cc.ReadOnly
	}
	if !sc.ReadOnly && !cc.AllowSharedWrites {
		return sc, fmt.Errorf("%s = false: tasks holding a shared dataset at once could overwrite each other's files; set allow_shared_writes = true as well to allow it", field("read_only"))
	}
	if cc.AllowSharedWrites && sc.ReadOnly {
		return sc, fmt.Errorf("%s = true with read_only = true: writes are allowed only with read_only = false", field("allow_shared_writes"))
	}
	return sc, nil
}

func validateClass(name string, cc ClassConfig, parent string) (slots.Class, error) {
	cl := slots.Class{Name: name, Slots: cc.Slots, ReadOnly: cc.ReadOnly != nil && *cc.ReadOnly}
	field := func(f string) string { return fmt.Sprintf("class %q: %s", name, f) }
	mp, err := validateCommon(name, cc)
	if err != nil {
		return cl, err
	}
	cl.MountPath = mp
	for _, f := range []struct {
		name string
		set  bool
	}{{"dataset", cc.Dataset != ""}, {"allow_shared_writes", cc.AllowSharedWrites}} {
		if f.set {
			return cl, fmt.Errorf("%s: only for a shared class (shared = true); this class gives each task its own dataset", field(f.name))
		}
	}
	if cc.Quota == "" {
		return cl, fmt.Errorf("%s is required", field("quota"))
	}
	q, err := zfs.ParseSize(cc.Quota)
	if err != nil {
		return cl, fmt.Errorf("%s = %q: %w", field("quota"), cc.Quota, err)
	}
	cl.Quota = q

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

	cl.Encrypted = cc.Encryption
	if cc.Source != "" && cc.Encryption {
		return cl, fmt.Errorf("%s: not with source = %q: a clone has its snapshot's encryption, not a key of its own", field("encryption"), cc.Source)
	}
	if cc.Source != "" {
		if err := validateSource(cc.Source, parent); err != nil {
			return cl, fmt.Errorf("%s = %q: %w", field("source"), cc.Source, err)
		}
		cl.Source = cc.Source
		if cc.OnRelease == slots.OnReleaseArchive {
			return cl, fmt.Errorf("%s = %q: a class with a source does not archive: an archived clone would keep the golden snapshot %s from being destroyed; use on_release = %q (the default with a source)",
				field("on_release"), cc.OnRelease, cc.Source, slots.OnReleaseDestroy)
		}
	}
	switch cc.OnRelease {
	case "":
		cl.OnRelease = DefaultOnRelease
		if cl.Source != "" {
			cl.OnRelease = slots.OnReleaseDestroy
		}
	case slots.OnReleaseArchive, slots.OnReleaseDestroy:
		cl.OnRelease = cc.OnRelease
	default:
		return cl, fmt.Errorf("%s = %q: want %q or %q", field("on_release"), cc.OnRelease, slots.OnReleaseArchive, slots.OnReleaseDestroy)
	}

	switch cc.Restore {
	case "", slots.RestoreOff:
		cl.Restore = slots.RestoreOff
	case slots.RestoreBestEffort, slots.RestoreRequired:
		if cl.OnRelease != slots.OnReleaseArchive {
			return cl, fmt.Errorf("%s = %q: a restore brings back an archive, and on_release = %q keeps none", field("restore"), cc.Restore, cl.OnRelease)
		}
		cl.Restore = cc.Restore
	default:
		return cl, fmt.Errorf("%s = %q: want %q, %q or %q", field("restore"), cc.Restore, slots.RestoreOff, slots.RestoreBestEffort, slots.RestoreRequired)
	}

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

// validateSource checks a class's source: a snapshot (dataset@name) in the
// parent's pool (a clone lives in its origin's pool) and outside the
// parent (the plugin owns everything under it).
func validateSource(src, parent string) error {
	ds, snap, ok := strings.Cut(src, "@")
	if !ok || snap == "" || strings.ContainsAny(snap, "@/# \t\n") {
		return fmt.Errorf("not a snapshot name: want dataset@snapshot, such as \"tank/golden/ci@v42\"")
	}
	if err := zfs.ValidateDatasetName(ds); err != nil {
		return err
	}
	switch {
	case ds == parent || strings.HasPrefix(ds, parent+"/"):
		return fmt.Errorf("is inside parent_dataset %q, which the plugin owns: keep golden datasets outside it", parent)
	case zfs.PoolOf(ds) != zfs.PoolOf(parent):
		return fmt.Errorf("is in pool %q, and parent_dataset %q in pool %q: a clone must be in its snapshot's pool", zfs.PoolOf(ds), parent, zfs.PoolOf(parent))
	}
	return nil
}

// validate checks the nomad block; a missing block means all defaults.
// Files named must exist now, so that a typo shows at agent start.
func (n *NomadConfig) validate() (allocwatch.Config, error) {
	if n == nil {
		return allocwatch.Config{}, nil
	}
	if n.Address != "" {
		if err := ValidateNomadAddress(n.Address); err != nil {
			return allocwatch.Config{}, fmt.Errorf("nomad.address = %q: %w", n.Address, err)
		}
	}
	for _, f := range []struct{ name, path string }{
		{"nomad.token_file", n.TokenFile}, {"nomad.ca_file", n.CAFile}, {"nomad.cert_file", n.CertFile}, {"nomad.key_file", n.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if !path.IsAbs(f.path) {
			return allocwatch.Config{}, fmt.Errorf("%s = %q: must be an absolute path", f.name, f.path)
		}
		if _, err := os.Stat(f.path); err != nil {
			return allocwatch.Config{}, fmt.Errorf("%s = %q: %w", f.name, f.path, err)
		}
	}
	if (n.CertFile == "") != (n.KeyFile == "") {
		return allocwatch.Config{}, fmt.Errorf("nomad.cert_file and nomad.key_file go together: set both or neither")
	}
	return allocwatch.Config{
		Address: n.Address, TokenFile: n.TokenFile, CAFile: n.CAFile, CertFile: n.CertFile,
		KeyFile: n.KeyFile, TLSServerName: n.TLSServerName, NodeID: n.NodeID,
	}, nil
}

// validate checks the telemetry block and returns the metrics address; a
// missing block or address means no metrics.
func (t *TelemetryConfig) validate() (string, error) {
	if t == nil || t.PrometheusAddress == "" {
		return "", nil
	}
	if err := metrics.ValidateAddress(t.PrometheusAddress); err != nil {
		return "", fmt.Errorf("telemetry.prometheus_address = %q: %w", t.PrometheusAddress, err)
	}
	return t.PrometheusAddress, nil
}

// ValidateNomadAddress checks a Nomad API address: an http, https or unix
// URL. The error says what is wanted; the caller names the field.
func ValidateNomadAddress(addr string) error {
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix") || (u.Host == "" && u.Scheme != "unix") {
		return errors.New("want a URL such as http://127.0.0.1:4646")
	}
	return nil
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
