package device

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/zclconf/go-cty/cty/msgpack"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Settings is a validated plugin configuration, for the operator CLI,
// which reads it from the agent's configuration files rather than from
// Nomad.
type Settings struct {
	Slots             slots.Config
	Nomad             allocwatch.Config
	FingerprintPeriod time.Duration
	StatsPeriod       time.Duration
	ReserveTimeout    time.Duration
	// Retention is what the archive keeps (keep, max_age, archive_quota).
	Retention retention.Rules
	// BackupDir is backup_dir ("" for none).
	BackupDir string
	// Shared are the shared classes (shared = true), sorted by name.
	Shared []shared.Class
}

// SettingsFromAgentConfig turns the `config { … }` of a plugin block, as
// decoded from the agent's HCL or JSON files, into validated settings. It
// follows the path Nomad's plugin loader takes (the block through the
// plugin's schema, with its defaults, to msgpack, then the plugin's own
// decoding and validation), so the CLI accepts and rejects exactly what
// SetConfig does, with the same errors. A nil config is an empty block.
func SettingsFromAgentConfig(config map[string]interface{}) (Settings, error) {
	if config == nil {
		config = map[string]interface{}{}
	}
	spec, diags := hclspecutils.Convert(configSpec)
	if diags.HasErrors() {
		return Settings{}, fmt.Errorf("nomad-device-zfs config schema: %w", diags)
	}
	val, diags, errs := hclutils.ParseHclInterface(config, spec, nil)
	if diags.HasErrors() {
		return Settings{}, fmt.Errorf("nomad-device-zfs config: %w", errors.Join(errs...))
	}
	b, err := msgpack.Marshal(val, val.Type())
	if err != nil {
		return Settings{}, fmt.Errorf("nomad-device-zfs config: encoding: %w", err)
	}
	var c Config
	if err := decodeConfig(b, &c); err != nil {
		return Settings{}, err
	}
	s, err := c.validate()
	if err != nil {
		return Settings{}, fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	return Settings{
		Slots:             s.slots,
		Nomad:             s.nomad,
		FingerprintPeriod: s.fingerprintPeriod,
		StatsPeriod:       s.statsPeriod,
		ReserveTimeout:    s.reserveTimeout,
		Retention:         s.retention,
		BackupDir:         s.backupDir,
		Shared:            s.shared,
	}, nil
}
