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
