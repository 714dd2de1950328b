// Package config is the plugin block an operator writes in the Nomad
// agent's configuration: its schema (what ConfigSchema sends), the Go
// shape of what SetConfig receives, and the validation that turns it into
// Settings, with errors that name the field and the value. The plugin
// (internal/device) and the operator CLI (internal/cli) both read the
// block through it, so both accept and refuse exactly the same blocks.
package config

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

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/configspec"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// PluginName is the name operators use in the agent's plugin block, and
// the plugin binary's.
const PluginName = "nomad-device-zfs"

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
	// DefaultMaxAge is a class's max_age when it archives and leaves
	// max_age out: archives (and backup_dir's chains, by the same policy)
	// released longer ago are pruned, so they are bounded out of the box.
	DefaultMaxAge = "720h"
	// MaxAgeNone is the max_age that turns the age limit off.
	MaxAgeNone = "none"
)

// Spec is the agent-side schema of the plugin block. Nomad parses agent
// configuration as HCL1, which turns `properties = { ... }` into a list of
// objects: properties is therefore a block of attributes (BlockAttrs), which
// accepts both `properties { ... }` and `properties = { ... }`, and class is
// a labelled block map.
var Spec = configspec.Object(map[string]configspec.Spec{
	"parent_dataset":     configspec.Attr("parent_dataset", "string", true),
	"fingerprint_period": withDefault("fingerprint_period", DefaultFingerprintPeriod),
	"stats_period":       withDefault("stats_period", DefaultStatsPeriod),
	"archive_quota":      configspec.Attr("archive_quota", "string", false),
	"key_dir":            configspec.Attr("key_dir", "string", false),
	"backup_dir":         configspec.Attr("backup_dir", "string", false),
	"reserve_timeout":    withDefault("reserve_timeout", DefaultReserveTimeout),
	"nomad": configspec.Block("nomad", false, configspec.Object(map[string]configspec.Spec{
		"address":         configspec.Attr("address", "string", false),
		"token_file":      configspec.Attr("token_file", "string", false),
		"ca_file":         configspec.Attr("ca_file", "string", false),
		"cert_file":       configspec.Attr("cert_file", "string", false),
		"key_file":        configspec.Attr("key_file", "string", false),
		"tls_server_name": configspec.Attr("tls_server_name", "string", false),
		"node_id":         configspec.Attr("node_id", "string", false),
	})),
	"telemetry": configspec.Block("telemetry", false, configspec.Object(map[string]configspec.Spec{
		"prometheus_address": configspec.Attr("prometheus_address", "string", false),
	})),
	"class": configspec.BlockMap("class", []string{"name"}, configspec.Object(map[string]configspec.Spec{
		"slots":      configspec.Attr("slots", "number", true),
		"quota":      configspec.Attr("quota", "string", false),
		"mount_path": configspec.Attr("mount_path", "string", false),
		// read_only has no default here: a shared class defaults to true,
		// an exclusive one to false (see validateClass).
		"read_only":           configspec.Attr("read_only", "bool", false),
		"shared":              configspec.Attr("shared", "bool", false),
		"dataset":             configspec.Attr("dataset", "string", false),
		"allow_shared_writes": configspec.Attr("allow_shared_writes", "bool", false),
		"source":              configspec.Attr("source", "string", false),
		"encryption":          configspec.Attr("encryption", "bool", false),
		"owner":               withDefault("owner", DefaultOwner),
		"mode":                withDefault("mode", DefaultMode),
		"properties":          configspec.BlockAttrs("properties", "string", false),
		// on_release has no default here: it is "archive", or "destroy"
		// for a class with a source (see validateClass).
		"on_release": configspec.Attr("on_release", "string", false),
		"restore":    withDefault("restore", DefaultRestore),
		"keep":       configspec.Attr("keep", "number", false),
		"max_age":    configspec.Attr("max_age", "string", false),
		// Live backups (see validateLive).
		"backup_interval": configspec.Attr("backup_interval", "string", false),
		"max_restore_lag": configspec.Attr("max_restore_lag", "string", false),
	})),
})

// withDefault is an optional string attribute with a default.
func withDefault(name, def string) configspec.Spec {
	return configspec.Default(configspec.Attr(name, "string", false), configspec.String(def))
}

// Config is the plugin block as SetConfig receives it (see Decode).
type Config struct {
	ParentDataset     string `cty:"parent_dataset"`
	FingerprintPeriod string `cty:"fingerprint_period"`
	StatsPeriod       string `cty:"stats_period"`
	ReserveTimeout    string `cty:"reserve_timeout"`
	// ArchiveQuota is the quota of <parent>/.archive ("" for none).
	ArchiveQuota string `cty:"archive_quota"`
	// BackupDir is a directory every client can reach, for zfs send
	// streams of the archives of classes with restore on ("" for none).
	BackupDir string `cty:"backup_dir"`
	// KeyDir holds the keys of encrypted classes' datasets ("" for
	// DefaultKeyDir).
	KeyDir    string                  `cty:"key_dir"`
	Nomad     *NomadConfig            `cty:"nomad"`
	Telemetry *TelemetryConfig        `cty:"telemetry"`
	Classes   map[string]*ClassConfig `cty:"class"`
}

// NomadConfig is the `nomad { ... }` block: how the plugin reads the node's
// allocations. Empty fields fall back to NOMAD_ADDR, NOMAD_TOKEN,
// NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY and NOMAD_TLS_SERVER_NAME,
// then to the local agent.
type NomadConfig struct {
	Address       string `cty:"address"`
	TokenFile     string `cty:"token_file"`
	CAFile        string `cty:"ca_file"`
	CertFile      string `cty:"cert_file"`
	KeyFile       string `cty:"key_file"`
	TLSServerName string `cty:"tls_server_name"`
	NodeID        string `cty:"node_id"`
}

// TelemetryConfig is the `telemetry { ... }` block. Without it, or with an
// empty prometheus_address, no metrics are served.
type TelemetryConfig struct {
	// PrometheusAddress is the host:port where Prometheus metrics are
	// served, at /metrics.
	PrometheusAddress string `cty:"prometheus_address"`
}

// ClassConfig is one `class "name" { ... }` block.
type ClassConfig struct {
	Slots     int    `cty:"slots"`
	Quota     string `cty:"quota"`
	MountPath string `cty:"mount_path"`
	// ReadOnly is nil when not given: true for a shared class, false for
	// an exclusive one.
	ReadOnly *bool `cty:"read_only"`
	// Shared makes the class one operator dataset (Dataset) that Slots
	// tasks may hold at once; AllowSharedWrites lets read_only be false.
	Shared            bool   `cty:"shared"`
	Dataset           string `cty:"dataset"`
	AllowSharedWrites bool   `cty:"allow_shared_writes"`
	// Source is a snapshot that fresh slots are cloned from ("" for
	// empty datasets).
	Source string `cty:"source"`
	// Encryption gives each slot its own key (OpenZFS only).
	Encryption bool              `cty:"encryption"`
	Owner      string            `cty:"owner"`
	Mode       string            `cty:"mode"`
	Properties map[string]string `cty:"properties"`
	OnRelease  string            `cty:"on_release"`
	// Restore is "off", "best-effort" or "required".
	Restore string `cty:"restore"`
	// Keep is how many archives each identity keeps (nil: DefaultKeep).
	Keep *int `cty:"keep"`
	// MaxAge prunes archives older than this ("" for DefaultMaxAge,
	// MaxAgeNone for no limit).
	MaxAge string `cty:"max_age"`
	// BackupInterval is how often a dataset in use is backed up into
	// backup_dir while its task runs ("" for only at release).
	BackupInterval string `cty:"backup_interval"`
	// MaxRestoreLag is how old a live backup (one taken while its task
	// ran) a restore = "required" restore takes ("" for any age).
	MaxRestoreLag string `cty:"max_restore_lag"`
}

// Settings is a validated configuration.
type Settings struct {
	Slots             slots.Config
	FingerprintPeriod time.Duration
	StatsPeriod       time.Duration
	ReserveTimeout    time.Duration
	Nomad             allocwatch.Config
	// MetricsAddress is where Prometheus metrics are served; "" for not.
	MetricsAddress string
	// Retention is what the archive keeps (keep, max_age, archive_quota).
	Retention retention.Rules
	// BackupDir is backup_dir ("" for none); BackupClasses the classes
	// whose archives go there (restore on).
	BackupDir     string
	BackupClasses map[string]bool
	// BackupLive are, by class, the backup_interval of classes that back
	// up their datasets in use; RestoreLag, by class, max_restore_lag.
	BackupLive map[string]time.Duration
	RestoreLag map[string]time.Duration
	// Shared are the shared classes (shared = true), sorted by name;
	// Slots.Classes holds the others.
	Shared []shared.Class
	// Encrypted: a class has encryption = true (key_dir is then made and
	// checked at SetConfig).
	Encrypted bool
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

// Decode reads the bytes Nomad's agent sends to SetConfig: the plugin
// block decoded with Spec, msgpack-encoded.
func Decode(b []byte) (Config, error) {
	var c Config
	if len(b) == 0 {
		return c, fmt.Errorf("the plugin block has no config: parent_dataset and a class are required")
	}
	if err := configspec.Decode(Spec, b, &c); err != nil {
		return c, err
	}
	return c, nil
}

// Read is what SetConfig does with the agent's bytes before it looks at
// the host's ZFS: Decode, then Validate. Errors start with the plugin's
// name and name the field.
func Read(b []byte) (Settings, error) {
	c, err := Decode(b)
	if err != nil {
		return Settings{}, fmt.Errorf("%s config: %w", PluginName, err)
	}
	s, err := c.Validate()
	if err != nil {
		return Settings{}, fmt.Errorf("%s config: %w", PluginName, err)
	}
	return s, nil
}

// Validate checks every field and returns the first problem, naming the
// field and the value. It reads the host only to look up owner names and
// to check that the files the nomad block names exist.
func (c *Config) Validate() (Settings, error) {
	var s Settings
	if c.ParentDataset == "" {
		return s, fmt.Errorf("parent_dataset is required")
	}
	if err := zfs.ValidateDatasetName(c.ParentDataset); err != nil {
		return s, fmt.Errorf("parent_dataset %q: %w", c.ParentDataset, err)
	}
	// Every name the plugin makes under the parent must fit ZFS: the
	// longest is a shortened archive name.
	if max := record.MaxNameLen - len("/"+record.ArchiveName+"/") - record.MinArchiveLeafLen; len(c.ParentDataset) > max {
		return s, fmt.Errorf("parent_dataset %q is %d bytes long: at most %d leave room for the names of archived datasets (ZFS allows %d)",
			c.ParentDataset, len(c.ParentDataset), max, record.MaxNameLen)
	}
	var err error
	if s.FingerprintPeriod, err = positiveDuration("fingerprint_period", c.FingerprintPeriod, DefaultFingerprintPeriod); err != nil {
		return s, err
	}
	if s.StatsPeriod, err = positiveDuration("stats_period", c.StatsPeriod, DefaultStatsPeriod); err != nil {
		return s, err
	}
	if s.ReserveTimeout, err = positiveDuration("reserve_timeout", c.ReserveTimeout, DefaultReserveTimeout); err != nil {
		return s, err
	}
	if s.Nomad, err = c.Nomad.validate(); err != nil {
		return s, err
	}
	if s.MetricsAddress, err = c.Telemetry.validate(); err != nil {
		return s, err
	}
	if len(c.Classes) == 0 {
		return s, fmt.Errorf("at least one class block is required")
	}
	s.Slots.Parent = c.ParentDataset
	s.Retention = retention.Rules{Classes: map[string]retention.Policy{}, Default: retention.Policy{Keep: retention.DefaultKeep}}
	s.BackupLive, s.RestoreLag = map[string]time.Duration{}, map[string]time.Duration{}
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
			s.Shared = append(s.Shared, sc)
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
		interval, lag, err := validateLive(name, *cc, cl, c.BackupDir)
		if err != nil {
			return s, err
		}
		if interval > 0 {
			s.BackupLive[name] = interval
		}
		if lag > 0 {
			s.RestoreLag[name] = lag
		}
		s.Slots.Classes = append(s.Slots.Classes, cl)
		s.Retention.Classes[name] = pol
		if cl.OnRelease == slots.OnReleaseArchive && cl.Quota > s.Retention.Headroom {
			s.Retention.Headroom = cl.Quota
		}
	}
	s.BackupClasses = map[string]bool{}
	for _, cl := range s.Slots.Classes {
		if cl.Restore == slots.RestoreBestEffort || cl.Restore == slots.RestoreRequired {
			s.BackupClasses[cl.Name] = true
			if c.BackupDir != "" {
				// Its archives are kept until sent.
				pol := s.Retention.Classes[cl.Name]
				pol.Backup = true
				s.Retention.Classes[cl.Name] = pol
			}
		}
	}
	encrypted := false
	for _, cl := range s.Slots.Classes {
		encrypted = encrypted || cl.Encrypted
	}
	// key_dir is kept without an encrypted class too: datasets made while
	// a class was encrypted still have their keys there, removed when
	// they are destroyed.
	s.Slots.KeyDir = DefaultKeyDir
	if c.KeyDir != "" {
		s.Slots.KeyDir = c.KeyDir
	}
	if kd := s.Slots.KeyDir; !path.IsAbs(kd) || path.Clean(kd) != kd || kd == "/" {
		return s, fmt.Errorf("key_dir = %q: must be an absolute, clean path other than /, such as %s", c.KeyDir, DefaultKeyDir)
	}
	s.Encrypted = encrypted
	if c.BackupDir != "" {
		if !path.IsAbs(c.BackupDir) || path.Clean(c.BackupDir) != c.BackupDir || c.BackupDir == "/" {
			return s, fmt.Errorf("backup_dir = %q: must be an absolute, clean path other than /, such as /mnt/zfs-backups", c.BackupDir)
		}
		if len(s.BackupClasses) == 0 {
			return s, fmt.Errorf("backup_dir = %q: no class has restore on, so nothing would be backed up or restored from it", c.BackupDir)
		}
		s.BackupDir = c.BackupDir
	}
	if c.ArchiveQuota != "" {
		q, err := zfs.ParseSize(c.ArchiveQuota)
		if err != nil {
			return s, fmt.Errorf("archive_quota = %q: %w", c.ArchiveQuota, err)
		}
		if q == 0 {
			return s, fmt.Errorf("archive_quota = %q: must be greater than zero (leave it out for no quota)", c.ArchiveQuota)
		}
		if q < s.Retention.Headroom {
			return s, fmt.Errorf("archive_quota = %q is less than the quota of a class that archives (%d bytes): no archive of that class could ever be kept; raise archive_quota or use on_release = \"destroy\"",
				c.ArchiveQuota, s.Retention.Headroom)
		}
		s.Retention.Quota = q
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
