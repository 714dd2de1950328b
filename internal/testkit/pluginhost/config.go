package pluginhost

import (
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/agentconfig"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/configspec"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/hclspecpb"
)

// EncodeConfig turns the HCL of a `config { ... }` block, as an operator
// writes it in the agent's plugin block, into the msgpack bytes that Nomad
// passes to SetConfig, given the schema as the plugin's ConfigSchema
// returned it. Like the agent, it parses HCL1 into a generic map, decodes
// that with the plugin's schema (defaults filled in), and msgpack-encodes
// the result.
func EncodeConfig(schema *hclspecpb.Spec, configBlock string) ([]byte, error) {
	spec, err := configspec.FromProto(schema)
	if err != nil {
		return nil, err
	}
	block, err := agentconfig.ParseConfig(configBlock)
	if err != nil {
		return nil, err
	}
	val, err := configspec.FromAgent(spec, block)
	if err != nil {
		return nil, fmt.Errorf("decoding the config with the plugin's schema: %w", err)
	}
	return configspec.Encode(val)
}
