package config

import (
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/configspec"
)

// FromAgent turns the `config { … }` of a plugin block, as decoded from the
// agent's HCL or JSON files (internal/agentconfig), into validated
// settings, for the operator CLI, which reads the agent's files rather
// than asking Nomad. It follows the path a configuration takes to the
// plugin (the block through Spec, with its defaults, to msgpack, then
// Read), so the CLI accepts and refuses exactly what SetConfig does, with
// the same errors. A nil config is an empty block.
func FromAgent(block map[string]interface{}) (Settings, error) {
	b, err := Encode(block)
	if err != nil {
		return Settings{}, err
	}
	return Read(b)
}

// Encode is what Nomad's agent sends to SetConfig for block: the block
// decoded with Spec (defaults filled in, unknown fields refused) and
// msgpack-encoded. Errors name the field.
func Encode(block map[string]interface{}) ([]byte, error) {
	val, err := configspec.FromAgent(Spec, block)
	if err != nil {
		return nil, fmt.Errorf("%s config: %w", PluginName, err)
	}
	return configspec.Encode(val)
}
