package configspec

import (
	"errors"
	"fmt"
	"strings"

	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// The agent's configuration reaches FromAgent as HCL 1 decodes it into Go
// values (the operator CLI reads it so, as Nomad does): a block is a list
// of maps (`nomad { ... }` gives []map[string]interface{} of one), a
// labelled block a list of one-key maps (`class "a" { ... }` gives
// [{"a": [{...}]}]), and `properties = { ... }` a list of one map. JSON
// objects (maps) are taken where lists are, as Nomad's JSON reading does.

// FromAgent decodes body, the content of a plugin's `config { ... }` block,
// with spec as the agent does before SetConfig: every field converted to
// its type, defaults filled in, unknown fields refused. The error names the
// field. A nil body is an empty block.
func FromAgent(spec Spec, body map[string]interface{}) (cty.Value, error) {
	if body == nil {
		body = map[string]interface{}{}
	}
	return spec.decode(body, "")
}

// blocks lists the bodies of the blocks in raw: nil for none, a map for
// one, a list of maps for each.
func blocks(raw interface{}, at string) ([]map[string]interface{}, error) {
	switch v := raw.(type) {
	case nil:
		return nil, nil
	case map[string]interface{}:
		return []map[string]interface{}{v}, nil
	case []map[string]interface{}:
		return v, nil
	case []interface{}:
		out := make([]map[string]interface{}, 0, len(v))
		for _, e := range v {
			m, ok := e.(map[string]interface{})
			if !ok {
				return nil, fmt.Errorf("%s: want a block, got %s", at, describe(e))
			}
			out = append(out, m)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: want a block, got %s", at, describe(raw))
}

// labelled groups the labelled blocks in raw by their first label: each
// one-key map is a label and what follows it.
func labelled(raw interface{}, at string) (map[string][]interface{}, error) {
	maps, err := blocks(raw, at)
	if err != nil {
		return nil, err
	}
	out := map[string][]interface{}{}
	for _, m := range maps {
		for _, label := range sortedKeys(m) {
			out[label] = append(out[label], m[label])
		}
	}
	return out, nil
}

// scalar converts one attribute's value to t, as the agent's decoder does
// (cty's conversions: "2" is a number, "true" a bool, 2 a string).
func scalar(raw interface{}, t cty.Type, at string) (cty.Value, error) {
	var v cty.Value
	switch x := raw.(type) {
	case string:
		lit, err := literalString(x)
		if err != nil {
			return cty.NilVal, fmt.Errorf("%s = %q: %w", at, x, err)
		}
		v = cty.StringVal(lit)
	case bool:
		v = cty.BoolVal(x)
	case int:
		v = cty.NumberIntVal(int64(x))
	case int64:
		v = cty.NumberIntVal(x)
	case float64:
		v = cty.NumberFloatVal(x)
	default:
		return cty.NilVal, fmt.Errorf("%s: want a %s, got %s", at, t.FriendlyName(), describe(raw))
	}
	out, err := convert.Convert(v, t)
	if err != nil {
		return cty.NilVal, fmt.Errorf("%s = %s: want a %s: %w", at, describe(raw), t.FriendlyName(), err)
	}
	return out, nil
}

// ErrTemplate is the error for a string holding an HCL template sequence.
var ErrTemplate = errors.New("the string holds an HCL template (${ or %{), which this reading does not evaluate; write the value literally")

// literalString is a string value as the agent reads it: Nomad's agent
// reads every string of a plugin block as an HCL template, in which $${
// stands for ${ and %%{ for %{. A string with a template sequence (${ or
// %{) is refused: the agent would evaluate it, or refuse it (a variable),
// and this package does neither.
func literalString(s string) (string, error) {
	if !strings.Contains(s, "${") && !strings.Contains(s, "%{") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case strings.HasPrefix(s[i:], "$${"), strings.HasPrefix(s[i:], "%%{"):
			b.WriteByte(s[i])
			b.WriteByte('{')
			i += 2
		case strings.HasPrefix(s[i:], "${"), strings.HasPrefix(s[i:], "%{"):
			return "", ErrTemplate
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), nil
}

// describe names a decoded value for an error.
func describe(raw interface{}) string {
	switch x := raw.(type) {
	case string:
		return fmt.Sprintf("%q", x)
	case bool, int, int64, float64:
		return fmt.Sprint(x)
	case []interface{}, []map[string]interface{}:
		return "a list or block"
	case map[string]interface{}:
		return "a block"
	}
	return fmt.Sprintf("a %T", raw)
}
