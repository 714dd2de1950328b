// Package devicetest drives the plugin as a Nomad client does, for tests:
// it encodes configuration as the agent does, builds the plugin binary and
// launches it over go-plugin gRPC, failing the test on error and cleaning
// up when it ends. It wraps internal/pluginhost, which the benchmarks use
// directly.
package devicetest

import (
	"github.com/hashicorp/nomad/plugins/shared/hclspec"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/pluginhost"
)

// EncodeConfig turns the HCL of a `config { ... }` block, as an operator
// writes it in the agent's plugin block, into the msgpack bytes that Nomad
// passes to SetConfig (see pluginhost.EncodeConfig).
func EncodeConfig(spec *hclspec.Spec, configBlock string) ([]byte, error) {
	return pluginhost.EncodeConfig(spec, configBlock)
}
