package pluginhost

import (
	"fmt"

	"github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/hcl/ast"
	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/zclconf/go-cty/cty/msgpack"
)

// EncodeConfig turns the HCL of a `config { ... }` block, as an operator
// writes it in the agent's plugin block, into the msgpack bytes that Nomad
// passes to SetConfig. Like the agent, it parses HCL1 into a generic map,
// decodes that with the plugin's schema, and msgpack-encodes the result.
func EncodeConfig(spec *hclspec.Spec, configBlock string) ([]byte, error) {
	root, err := hcl.Parse(configBlock)
	if err != nil {
		return nil, fmt.Errorf("parsing HCL: %w", err)
	}
	list, ok := root.Node.(*ast.ObjectList)
	if !ok || len(list.Items) != 1 {
		return nil, fmt.Errorf("want exactly one config block")
	}
	var m map[string]interface{}
	if err := hcl.DecodeObject(&m, list.Items[0]); err != nil {
		return nil, fmt.Errorf("decoding HCL: %w", err)
	}
	raw := m["config"]
	// HCL1 yields a list of one object per block.
	if l, ok := raw.([]map[string]interface{}); ok && len(l) == 1 {
		raw = l[0]
	}
	if raw == nil {
		raw = map[string]interface{}{}
	}
	decSpec, diags := hclspecutils.Convert(spec)
	if diags.HasErrors() {
		return nil, fmt.Errorf("converting schema: %s", diags.Error())
	}
	val, diags, errs := hclutils.ParseHclInterface(raw, decSpec, nil)
	if diags.HasErrors() {
		return nil, fmt.Errorf("decoding config with the plugin schema: %v", errs)
	}
	return msgpack.Marshal(val, val.Type())
}
