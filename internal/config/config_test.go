package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/agentconfig"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// decode runs an agent-style config block through the schema and validation.
func decode(t *testing.T, block string) (Settings, error) {
	t.Helper()
	b, err := encode(t, block)
	must.NoError(t, err)
	c, err := Decode(b)
	must.NoError(t, err)
	return c.Validate()
}

// encode is what the agent sends for an HCL config block.
func encode(t *testing.T, block string) ([]byte, error) {
	t.Helper()
	m, err := agentconfig.ParseConfig(block)
	must.NoError(t, err)
	return Encode(m)
}

func TestConfig_Defaults(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  class "scratch" {
    slots = 4
    quota = "10GiB"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, 30*time.Second, s.FingerprintPeriod)
	must.Eq(t, 10*time.Second, s.StatsPeriod)
	must.Eq(t, "tank/nomad", s.Slots.Parent)
	must.SliceLen(t, 1, s.Slots.Classes)
	c := s.Slots.Classes[0]
	must.Eq(t, "scratch", c.Name)
	must.Eq(t, 4, c.Slots)
	must.Eq(t, uint64(10<<30), c.Quota)
	must.Eq(t, "/zfs/scratch", c.MountPath)
	must.False(t, c.ReadOnly)
	must.Eq(t, 65534, c.UID)
	must.Eq(t, 65534, c.GID)
	must.Eq(t, os.FileMode(0o770), c.Mode)
	must.MapEmpty(t, c.Properties)
	must.Eq(t, "archive", c.OnRelease)
	must.Eq(t, "off", c.Restore)
	must.Eq(t, 2*time.Minute, s.ReserveTimeout)
	must.Eq(t, allocwatch.Config{}, s.Nomad)
	must.Eq(t, retention.Rules{Classes: map[string]retention.Policy{"scratch": {Keep: retention.DefaultKeep, MaxAge: 720 * time.Hour}},
		Default: retention.Policy{Keep: retention.DefaultKeep}, Headroom: 10 << 30}, s.Retention)
}

func TestConfig_Retention(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  archive_quota  = "200GiB"
  class "state" {
    slots   = 2
    quota   = "10GiB"
    keep    = 5
    max_age = "168h"
    restore = "required"
  }
  class "big" {
    slots = 1
    quota = "50GiB"
  }
  class "tmp" {
    slots      = 1
    quota      = "100GiB"
    on_release = "destroy"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, retention.Rules{
		Classes: map[string]retention.Policy{
			"state": {Keep: 5, MaxAge: 168 * time.Hour},
			"big":   {Keep: retention.DefaultKeep, MaxAge: 720 * time.Hour}, // max_age left out
			"tmp":   {Keep: retention.DefaultKeep},                          // destroys: no archives of its own
		},
		Default:  retention.Policy{Keep: retention.DefaultKeep},
		Quota:    200 << 30,
		Headroom: 50 << 30, // the largest class that archives; "tmp" destroys
	}, s.Retention)
	must.Eq(t, []string{"big", "state", "tmp"}, []string{s.Slots.Classes[0].Name, s.Slots.Classes[1].Name, s.Slots.Classes[2].Name})
	must.Eq(t, "off", s.Slots.Classes[0].Restore)
	must.Eq(t, "required", s.Slots.Classes[1].Restore)
	must.Eq(t, "", s.BackupDir)
	must.Eq(t, map[string]bool{"state": true}, s.BackupClasses)
}

func TestConfig_LiveBackups(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  backup_dir     = "/mnt/backups"
  class "db" {
    slots           = 2
    quota           = "10GiB"
    restore         = "required"
    backup_interval = "5m"
    max_restore_lag = "15m"
  }
  class "cache" {
    slots           = 1
    quota           = "1GiB"
    restore         = "best-effort"
    backup_interval = "1h"
  }
  class "plain" {
    slots   = 1
    quota   = "1GiB"
    restore = "required"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, map[string]time.Duration{"db": 5 * time.Minute, "cache": time.Hour}, s.BackupLive)
	must.Eq(t, map[string]time.Duration{"db": 15 * time.Minute}, s.RestoreLag)
	must.Eq(t, map[string]bool{"db": true, "cache": true, "plain": true}, s.BackupClasses)
	for _, name := range []string{"db", "cache", "plain"} {
		must.True(t, s.Retention.Classes[name].Backup, must.Sprintf("class %s: its archives are kept until sent", name))
	}
}

func TestConfig_NomadBlockAndRelease(t *testing.T) {
	token := filepath.Join(t.TempDir(), "zfs.token")
	must.NoError(t, os.WriteFile(token, []byte("secret"), 0o600))
	s, err := decode(t, `config {
  parent_dataset  = "tank/nomad"
  reserve_timeout = "45s"
  nomad {
    address         = "https://nomad.example:4646"
    token_file      = "`+token+`"
    tls_server_name = "client.global.nomad"
    node_id         = "abc"
  }
  class "scratch" {
    slots      = 1
    quota      = "1G"
    on_release = "destroy"
  }
}`)
	must.NoError(t, err)
	must.Eq(t, 45*time.Second, s.ReserveTimeout)
	must.Eq(t, allocwatch.Config{Address: "https://nomad.example:4646", TokenFile: token, TLSServerName: "client.global.nomad", NodeID: "abc"}, s.Nomad)
	must.Eq(t, "destroy", s.Slots.Classes[0].OnRelease)
}

func TestConfig_FullAndBothPropertySyntaxes(t *testing.T) {
	for _, props := range []string{
		`properties = { compression = "lz4", recordsize = "1M" }`,
		"properties {\n compression = \"lz4\"\n recordsize = \"1M\"\n }",
	} {
		s, err := decode(t, `config {
  parent_dataset     = "tank/nomad"
  fingerprint_period = "5s"
  stats_period       = "1m"
  class "fast-1" {
    slots      = 2
    quota      = "512M"
    mount_path = "/data/fast"
    read_only  = true
    owner      = "root:0"
    mode       = "0700"
    `+props+`
  }
  class "scratch" {
    slots = 0
    quota = "1073741824"
  }
}`)
		must.NoError(t, err)
		must.Eq(t, 5*time.Second, s.FingerprintPeriod)
		must.Eq(t, time.Minute, s.StatsPeriod)
		must.SliceLen(t, 2, s.Slots.Classes)
		c := s.Slots.Classes[0]
		must.Eq(t, "fast-1", c.Name)
		must.Eq(t, "/data/fast", c.MountPath)
		must.True(t, c.ReadOnly)
		must.Eq(t, 0, c.UID)
		must.Eq(t, os.FileMode(0o700), c.Mode)
		must.Eq(t, map[string]string{"compression": "lz4", "recordsize": "1M"}, c.Properties)
		must.Eq(t, uint64(1<<30), s.Slots.Classes[1].Quota)
		must.Eq(t, 0, s.Slots.Classes[1].Slots)
	}
}

// withBackupDir is a configuration with backup_dir and one class "b" whose
// body is body, beside a class "a" with restore on (so that backup_dir
// itself is valid).
func withBackupDir(body string) string {
	return `config {
  parent_dataset = "tank/nomad"
  backup_dir     = "/mnt/backups"
  class "a" {
    slots   = 1
    quota   = "1G"
    restore = "required"
  }
  class "b" {
    ` + body + `
  }
}`
}

func TestConfig_Invalid(t *testing.T) {
	class := func(body string) string {
		return `config {
  parent_dataset = "tank/nomad"
  class "scratch" {
    ` + body + `
  }
}`
	}
	cases := []struct {
		name, block, wantErr string
	}{
		{"no classes", `config {
  parent_dataset = "tank/nomad"
}`, "at least one class block is required"},
		{"bad parent", `config {
  parent_dataset = "tank//nomad"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `parent_dataset "tank//nomad"`},
		{"option-like parent", `config {
  parent_dataset = "-o"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `starts with '-'`},
		{"bad fingerprint period", `config {
  parent_dataset = "tank/nomad"
  fingerprint_period = "soon"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `fingerprint_period = "soon"`},
		{"zero stats period", `config {
  parent_dataset = "tank/nomad"
  stats_period = "0s"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `stats_period = "0s": must be greater than zero`},
		{"bad class name", `config {
  parent_dataset = "tank/nomad"
  class "Scratch" {
    slots = 1
    quota = "1G"
  }
}`, `class name "Scratch"`},
		{"class name too long", `config {
  parent_dataset = "tank/nomad"
  class "a123456789012345678901234567890123" {
    slots = 1
    quota = "1G"
  }
}`, `at most 32 characters`},
		{"negative slots", class(`slots = -1
    quota = "1G"`), `class "scratch": slots = -1`},
		{"bad quota", class(`slots = 1
    quota = "10Q"`), `class "scratch": quota = "10Q"`},
		{"zero quota", class(`slots = 1
    quota = "0"`), `greater than zero`},
		{"relative mount path", class(`slots = 1
    quota = "1G"
    mount_path = "zfs/x"`), `class "scratch": mount_path = "zfs/x"`},
		{"unclean mount path", class(`slots = 1
    quota = "1G"
    mount_path = "/zfs/../etc"`), `mount_path = "/zfs/../etc"`},
		{"root mount path", class(`slots = 1
    quota = "1G"
    mount_path = "/"`), `mount_path = "/"`},
		{"bad owner", class(`slots = 1
    quota = "1G"
    owner = "65534"`), `owner = "65534": want uid:gid`},
		{"unknown user", class(`slots = 1
    quota = "1G"
    owner = "no-such-user-xyz:0"`), `user "no-such-user-xyz"`},
		{"bad mode", class(`slots = 1
    quota = "1G"
    mode = "0999"`), `mode = "0999"`},
		{"mode too wide", class(`slots = 1
    quota = "1G"
    mode = "4777"`), `mode = "4777"`},
		{"forbidden mountpoint", class(`slots = 1
    quota = "1G"
    properties = { mountpoint = "/x" }`), `"mountpoint" may not be set`},
		{"forbidden refquota", class(`slots = 1
    quota = "1G"
    properties = { refquota = "1G" }`), `"refquota" may not be set: use the class quota`},
		{"forbidden canmount", class(`slots = 1
    quota = "1G"
    properties = { canmount = "off" }`), `"canmount" may not be set`},
		{"forbidden quota", class(`slots = 1
    quota = "1G"
    properties = { quota = "1G" }`), `"quota" may not be set`},
		{"plugin's own property", class(`slots = 1
    quota = "1G"
    properties = { "nomad-device-zfs:state" = "free" }`), `the plugin's own properties are reserved`},
		{"bad property name", class(`slots = 1
    quota = "1G"
    properties = { "Compression" = "on" }`), `"Compression" is not a valid ZFS property name`},
		{"bad on_release", class(`slots = 1
    quota = "1G"
    on_release = "keep"`), `class "scratch": on_release = "keep": want "archive" or "destroy"`},
		{"bad reserve_timeout", `config {
  parent_dataset = "tank/nomad"
  reserve_timeout = "-1s"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `reserve_timeout = "-1s"`},
		{"bad nomad address", `config {
  parent_dataset = "tank/nomad"
  nomad {
    address = "127.0.0.1:4646"
  }
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `nomad.address = "127.0.0.1:4646"`},
		{"missing token file", `config {
  parent_dataset = "tank/nomad"
  nomad {
    token_file = "/nonexistent/zfs.token"
  }
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `nomad.token_file = "/nonexistent/zfs.token"`},
		{"relative ca file", `config {
  parent_dataset = "tank/nomad"
  nomad {
    ca_file = "ca.pem"
  }
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `nomad.ca_file = "ca.pem": must be an absolute path`},
		{"cert without key", `config {
  parent_dataset = "tank/nomad"
  nomad {
    cert_file = "/etc/hostname"
  }
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `nomad.cert_file and nomad.key_file go together`},
		{"empty property value", class(`slots = 1
    quota = "1G"
    properties = { compression = "" }`), `compression = "": value must be non-empty`},
		{"restore unknown", class(`slots = 1
    quota = "1G"
    restore = "always"`), `class "scratch": restore = "always": want "off", "best-effort" or "required"`},
		{"restore with destroy", class(`slots = 1
    quota = "1G"
    on_release = "destroy"
    restore = "required"`), `class "scratch": restore = "required": a restore brings back an archive, and on_release = "destroy" keeps none`},
		{"backup_dir relative", `config {
  parent_dataset = "tank/nomad"
  backup_dir     = "backups"
  class "a" {
    slots   = 1
    quota   = "1G"
    restore = "required"
  }
}`, `backup_dir = "backups": must be an absolute, clean path other than /`},
		{"backup_dir without restore", `config {
  parent_dataset = "tank/nomad"
  backup_dir     = "/mnt/backups"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `backup_dir = "/mnt/backups": no class has restore on`},
		{"backup_interval without restore", withBackupDir(`slots = 1
    quota = "1G"
    backup_interval = "5m"`), `class "b": backup_interval = "5m": live backups are restored on another node, and restore = "off" restores nothing`},
		{"backup_interval without backup_dir", class(`slots = 1
    quota = "1G"
    restore = "required"
    backup_interval = "5m"`), `class "scratch": backup_interval = "5m": live backups go to backup_dir, and none is set`},
		{"backup_interval not a duration", withBackupDir(`slots = 1
    quota = "1G"
    restore = "required"
    backup_interval = "5 minutes"`), `class "b": backup_interval = "5 minutes": not a duration`},
		{"backup_interval too short", withBackupDir(`slots = 1
    quota = "1G"
    restore = "required"
    backup_interval = "10ms"`), `class "b": backup_interval = "10ms": must be at least 1s`},
		{"max_restore_lag with best-effort", withBackupDir(`slots = 1
    quota = "1G"
    restore = "best-effort"
    max_restore_lag = "10m"`), `class "b": max_restore_lag = "10m": it bounds what a restore = "required" takes, and this class has restore = "best-effort"`},
		{"max_restore_lag negative", withBackupDir(`slots = 1
    quota = "1G"
    restore = "required"
    max_restore_lag = "-1m"`), `class "b": max_restore_lag = "-1m": must be at least 1s`},
		{"backup_interval on a shared class", `config {
  parent_dataset = "tank/nomad"
  class "models" {
    shared = true
    dataset = "tank/models"
    slots = 2
    backup_interval = "5m"
  }
}`, `class "models": backup_interval: not for a shared class`},
		{"keep zero", class(`slots = 1
    quota = "1G"
    keep = 0`), `class "scratch": keep = 0: must be from 1 to 10000`},
		{"keep with destroy", class(`slots = 1
    quota = "1G"
    on_release = "destroy"
    keep = 2`), `class "scratch": keep/max_age: keep and max_age apply to archives, and on_release = "destroy" keeps none`},
		{"archive_quota not a size", `config {
  parent_dataset = "tank/nomad"
  archive_quota  = "lots"
  class "a" {
    slots = 1
    quota = "1G"
  }
}`, `archive_quota = "lots"`},
		{"archive_quota below a class quota", `config {
  parent_dataset = "tank/nomad"
  archive_quota  = "1G"
  class "a" {
    slots = 1
    quota = "2G"
  }
}`, `archive_quota = "1G" is less than the quota of a class that archives (2147483648 bytes)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decode(t, tc.block)
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// max_age: a class that archives and leaves it out is bounded by
// DefaultMaxAge; "none" turns the limit off; anything else must be a
// duration greater than zero, and an error names the field and the value.
func TestConfig_MaxAge(t *testing.T) {
	block := func(onRelease, maxAge string) string {
		b := "config {\n  parent_dataset = \"tank/nomad\"\n  class \"state\" {\n    slots = 1\n    quota = \"1G\"\n"
		if onRelease != "" {
			b += "    on_release = \"" + onRelease + "\"\n"
		}
		if maxAge != "" {
			b += "    max_age = \"" + maxAge + "\"\n"
		}
		return b + "  }\n}"
	}
	cases := []struct {
		name, onRelease, maxAge string
		want                    time.Duration
		wantErr                 string
	}{
		{name: "left out: the default", want: 720 * time.Hour},
		{name: "left out, archive given: the default", onRelease: "archive", want: 720 * time.Hour},
		{name: "none: no age limit", maxAge: "none", want: 0},
		{name: "a duration", maxAge: "168h", want: 168 * time.Hour},
		{name: "longer than the default", maxAge: "8760h", want: 8760 * time.Hour},
		{name: "destroy: no archives, no age", onRelease: "destroy", want: 0},
		{name: "zero", maxAge: "0", wantErr: `class "state": max_age = "0": must be greater than zero (use "none" for no age limit)`},
		{name: "zero seconds", maxAge: "0s", wantErr: `class "state": max_age = "0s": must be greater than zero`},
		{name: "negative", maxAge: "-1h", wantErr: `class "state": max_age = "-1h": must be greater than zero (use "none" for no age limit)`},
		{name: "days are no Go duration", maxAge: "7d", wantErr: `class "state": max_age = "7d": not a duration (use a value such as "168h", or "none" for no age limit)`},
		{name: "garbage", maxAge: "forever", wantErr: `class "state": max_age = "forever": not a duration`},
		{name: "None is not none", maxAge: "None", wantErr: `class "state": max_age = "None": not a duration`},
		{name: "none with destroy", onRelease: "destroy", maxAge: "none",
			wantErr: `class "state": keep/max_age: keep and max_age apply to archives, and on_release = "destroy" keeps none`},
		{name: "a duration with destroy", onRelease: "destroy", maxAge: "24h",
			wantErr: `class "state": keep/max_age: keep and max_age apply to archives`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := decode(t, block(tc.onRelease, tc.maxAge))
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, retention.Policy{Keep: retention.DefaultKeep, MaxAge: tc.want}, s.Retention.Classes["state"])
			// Archives of a class no longer configured keep their own
			// default: no age limit.
			must.Eq(t, retention.Policy{Keep: retention.DefaultKeep}, s.Retention.Default)
		})
	}
}

func TestConfig_SchemaRejectsMissingRequired(t *testing.T) {
	_, err := encode(t, `config {
  class "a" {
    slots = 1
    quota = "1G"
  }
}`)
	must.ErrorContains(t, err, "parent_dataset")
	_, err = encode(t, `config {
  parent_dataset = "tank/nomad"
  class "a" {
    quota = "1G"
  }
}`)
	must.ErrorContains(t, err, "slots")
}

// Each class keeps its own properties: the decoder once reused one value
// for every class, so one class's properties leaked into the others.
func TestConfig_ClassesKeepTheirOwnProperties(t *testing.T) {
	s, err := decode(t, `config {
  parent_dataset = "tank/nomad"
  class "a" {
    slots = 1
    quota = "1G"
    properties = { compression = "on" }
  }
  class "b" {
    slots = 1
    quota = "1G"
  }
  class "d" {
    slots = 1
    quota = "1G"
    properties = { recordsize = "64K" }
  }
  class "c" {
    slots = 1
    quota = "1G"
    properties { atime = "off" }
  }
}`)
	must.NoError(t, err)
	must.SliceLen(t, 4, s.Slots.Classes)
	must.Eq(t, map[string]string{"compression": "on"}, s.Slots.Classes[0].Properties)
	must.MapEmpty(t, s.Slots.Classes[1].Properties)
	must.Eq(t, map[string]string{"atime": "off"}, s.Slots.Classes[2].Properties)
	must.Eq(t, map[string]string{"recordsize": "64K"}, s.Slots.Classes[3].Properties)
}

func TestConfig_Telemetry(t *testing.T) {
	block := func(telemetry string) string {
		return `config {
  parent_dataset = "tank/nomad"
  ` + telemetry + `
  class "a" {
    slots = 1
    quota = "1G"
  }
}`
	}
	cases := []struct {
		name, telemetry, want, wantErr string
	}{
		{name: "absent: off"},
		{name: "empty block: off", telemetry: `telemetry {}`},
		{name: "empty address: off", telemetry: `telemetry { prometheus_address = "" }`},
		{name: "loopback", telemetry: `telemetry { prometheus_address = "127.0.0.1:9715" }`, want: "127.0.0.1:9715"},
		{name: "every interface", telemetry: `telemetry { prometheus_address = ":9715" }`, want: ":9715"},
		{name: "ipv6", telemetry: `telemetry { prometheus_address = "[::1]:9715" }`, want: "[::1]:9715"},
		{name: "no port", telemetry: `telemetry { prometheus_address = "127.0.0.1" }`,
			wantErr: `telemetry.prometheus_address = "127.0.0.1": want host:port`},
		{name: "port zero", telemetry: `telemetry { prometheus_address = "127.0.0.1:0" }`,
			wantErr: `telemetry.prometheus_address = "127.0.0.1:0": port "0": want a number from 1 to 65535`},
		{name: "port too big", telemetry: `telemetry { prometheus_address = "127.0.0.1:65536" }`,
			wantErr: `telemetry.prometheus_address = "127.0.0.1:65536": port "65536"`},
		{name: "named port", telemetry: `telemetry { prometheus_address = "localhost:http" }`,
			wantErr: `telemetry.prometheus_address = "localhost:http": port "http"`},
		{name: "url", telemetry: `telemetry { prometheus_address = "http://127.0.0.1:9715" }`,
			wantErr: `telemetry.prometheus_address = "http://127.0.0.1:9715"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := decode(t, block(tc.telemetry))
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, s.MetricsAddress)
		})
	}
}
