// Package configspec is the schema language in which a Nomad plugin
// describes its `config { ... }` block (Nomad's hclspec), for the subset
// this project uses: objects of attributes, nested blocks, labelled block
// maps, blocks of attributes, defaults and literals.
//
// A Spec is built once (Object, Attr, Block, BlockMap, BlockAttrs, Default,
// Literal) and then serves three readers:
//
//   - Proto is the schema as ConfigSchema sends it to Nomad's agent;
//   - FromAgent decodes a plugin block as the agent does before it calls
//     SetConfig (its HCL or JSON decoded into maps and lists), with
//     defaults filled in, and Encode gives the msgpack bytes the agent
//     sends, so that the operator CLI and the tests read a configuration
//     exactly as the plugin will receive it;
//   - Decode reads those bytes back into a Go struct (the plugin's side of
//     SetConfig).
//
// The value between the two is a cty value of the type the schema implies
// (Spec.Type); msgpack is go-cty's encoding of it, as Nomad's agent uses.
package configspec

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/hclspecpb"
)

// Spec is one node of a schema.
type Spec interface {
	// Proto is the node as the agent receives it.
	Proto() *hclspecpb.Spec
	// Type is the cty type of the value the node decodes to.
	Type() cty.Type
	// decode reads the node's part of body (the content of one block);
	// at names where the value sits, for errors.
	decode(body map[string]interface{}, at string) (cty.Value, error)
	// keys are the attribute and block names the node reads from a body.
	keys() []string
}

// primitive maps the type expressions this package accepts to cty types.
var primitive = map[string]cty.Type{"string": cty.String, "number": cty.Number, "bool": cty.Bool}

// mustType is the cty type of a type expression; it panics on one this
// package does not handle (a schema is a program's constant).
func mustType(expr string) cty.Type {
	t, ok := primitive[expr]
	if !ok {
		panic(fmt.Sprintf("configspec: type %q: only string, number and bool are supported", expr))
	}
	return t
}

// Object is an object built from the same body: one attribute per entry,
// each read by its spec. Keys of the body that no entry reads are errors.
func Object(attrs map[string]Spec) Spec { return object(attrs) }

type object map[string]Spec

func (o object) Proto() *hclspecpb.Spec {
	m := make(map[string]*hclspecpb.Spec, len(o))
	for k, s := range o {
		m[k] = s.Proto()
	}
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Object{Object: &hclspecpb.Object{Attributes: m}}}
}

func (o object) Type() cty.Type {
	m := make(map[string]cty.Type, len(o))
	for k, s := range o {
		m[k] = s.Type()
	}
	return cty.Object(m)
}

func (o object) keys() []string { return nil }

func (o object) decode(body map[string]interface{}, at string) (cty.Value, error) {
	known := map[string]bool{}
	for _, s := range o {
		for _, k := range s.keys() {
			known[k] = true
		}
	}
	for _, k := range sortedKeys(body) {
		if !known[k] {
			return cty.NilVal, fmt.Errorf("%s: unknown field; the fields here are %s", join(at, k), strings.Join(sortedSet(known), ", "))
		}
	}
	vals := make(map[string]cty.Value, len(o))
	for _, k := range sortedKeys(o) {
		v, err := o[k].decode(body, at)
		if err != nil {
			return cty.NilVal, err
		}
		vals[k] = v
	}
	return cty.ObjectVal(vals), nil
}

// Attr reads the attribute name, converted to typ ("string", "number" or
// "bool") as the agent converts it ("2" is a number, 2 a string); absent,
// it is null, or an error when required.
func Attr(name, typ string, required bool) Spec {
	return &attr{name: name, typ: typ, cty: mustType(typ), required: required}
}

type attr struct {
	name, typ string
	cty       cty.Type
	required  bool
}

func (a *attr) Proto() *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Attr{Attr: &hclspecpb.Attr{Name: a.name, Type: a.typ, Required: a.required}}}
}

func (a *attr) Type() cty.Type { return a.cty }
func (a *attr) keys() []string { return []string{a.name} }

func (a *attr) decode(body map[string]interface{}, at string) (cty.Value, error) {
	raw, ok := body[a.name]
	if !ok || raw == nil {
		if a.required {
			return cty.NilVal, fmt.Errorf("%s is required", join(at, a.name))
		}
		return cty.NullVal(a.cty), nil
	}
	return scalar(raw, a.cty, join(at, a.name))
}

// Block reads at most one block name (exactly one when required) and
// decodes its body with nested; absent, it is null.
func Block(name string, required bool, nested Spec) Spec {
	return &block{name: name, required: required, nested: nested}
}

type block struct {
	name     string
	required bool
	nested   Spec
}

func (b *block) Proto() *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{Name: b.name, Required: b.required, Nested: b.nested.Proto()}}}
}

func (b *block) Type() cty.Type { return b.nested.Type() }
func (b *block) keys() []string { return []string{b.name} }

func (b *block) decode(body map[string]interface{}, at string) (cty.Value, error) {
	where := join(at, b.name)
	content, err := single(body, b.name, where, b.required)
	if err != nil || content == nil {
		return cty.NullVal(b.Type()), err
	}
	return b.nested.decode(content, where)
}

// single is the content of the one block name in body: nil when there is
// none (an error when required), an error when there are several.
func single(body map[string]interface{}, name, where string, required bool) (map[string]interface{}, error) {
	bodies, err := blocks(body[name], where)
	switch {
	case err != nil:
		return nil, err
	case len(bodies) == 0 && required:
		return nil, fmt.Errorf("a %s block is required", where)
	case len(bodies) > 1:
		return nil, fmt.Errorf("%s: only one such block is allowed, found %d", where, len(bodies))
	case len(bodies) == 0:
		return nil, nil
	}
	return bodies[0], nil
}

// BlockMap reads any number of blocks name labelled `name "label" { ... }`
// into a map keyed by the label (one level of map per label name), each
// decoded with nested. Without blocks it is an empty map.
func BlockMap(name string, labels []string, nested Spec) Spec {
	if len(labels) == 0 {
		panic("configspec: BlockMap " + name + " needs at least one label")
	}
	return &blockMap{name: name, labels: labels, nested: nested}
}

type blockMap struct {
	name   string
	labels []string
	nested Spec
}

func (m *blockMap) Proto() *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_BlockMap{BlockMap: &hclspecpb.BlockMap{Name: m.name, Labels: m.labels, Nested: m.nested.Proto()}}}
}

func (m *blockMap) Type() cty.Type {
	t := m.nested.Type()
	for range m.labels {
		t = cty.Map(t)
	}
	return t
}

func (m *blockMap) keys() []string { return []string{m.name} }

func (m *blockMap) decode(body map[string]interface{}, at string) (cty.Value, error) {
	return m.level(body[m.name], join(at, m.name), len(m.labels))
}

// level decodes the blocks under raw that still need depth labels.
func (m *blockMap) level(raw interface{}, at string, depth int) (cty.Value, error) {
	if depth == 0 {
		bodies, err := blocks(raw, at)
		if err != nil {
			return cty.NilVal, err
		}
		if len(bodies) != 1 {
			return cty.NilVal, fmt.Errorf("%s: only one such block is allowed, found %d", at, len(bodies))
		}
		return m.nested.decode(bodies[0], at)
	}
	byLabel, err := labelled(raw, at)
	if err != nil {
		return cty.NilVal, err
	}
	elemType := m.nested.Type()
	for i := 1; i < depth; i++ {
		elemType = cty.Map(elemType)
	}
	if len(byLabel) == 0 {
		return cty.MapValEmpty(elemType), nil
	}
	vals := make(map[string]cty.Value, len(byLabel))
	for _, label := range sortedKeys(byLabel) {
		parts := byLabel[label]
		where := fmt.Sprintf("%s %q", at, label)
		if depth == 1 && len(parts) > 1 {
			return cty.NilVal, fmt.Errorf("%s: defined more than once; the labels of %s blocks must be unique", where, m.name)
		}
		var inner interface{} = parts
		if len(parts) == 1 {
			inner = parts[0]
		}
		v, err := m.level(inner, where, depth-1)
		if err != nil {
			return cty.NilVal, err
		}
		vals[label] = v
	}
	return cty.MapVal(vals), nil
}

// BlockAttrs reads one block name whose attributes, each converted to typ,
// make a map; absent, it is null (an error when required), and empty, an
// empty map.
func BlockAttrs(name, typ string, required bool) Spec {
	return &blockAttrs{name: name, typ: typ, elem: mustType(typ), required: required}
}

type blockAttrs struct {
	name, typ string
	elem      cty.Type
	required  bool
}

func (b *blockAttrs) Proto() *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_BlockAttrs{BlockAttrs: &hclspecpb.BlockAttrs{Name: b.name, Type: b.typ, Required: b.required}}}
}

func (b *blockAttrs) Type() cty.Type { return cty.Map(b.elem) }
func (b *blockAttrs) keys() []string { return []string{b.name} }

func (b *blockAttrs) decode(body map[string]interface{}, at string) (cty.Value, error) {
	where := join(at, b.name)
	content, err := single(body, b.name, where, b.required)
	if err != nil || content == nil {
		return cty.NullVal(b.Type()), err
	}
	if len(content) == 0 {
		return cty.MapValEmpty(b.elem), nil
	}
	vals := make(map[string]cty.Value, len(content))
	for _, k := range sortedKeys(content) {
		v, err := scalar(content[k], b.elem, join(where, k))
		if err != nil {
			return cty.NilVal, err
		}
		vals[k] = v
	}
	return cty.MapVal(vals), nil
}

// Default is primary's value, or def's where primary's is null.
func Default(primary, def Spec) Spec { return &dflt{primary: primary, def: def} }

type dflt struct{ primary, def Spec }

func (d *dflt) Proto() *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Default{Default: &hclspecpb.Default{Primary: d.primary.Proto(), Default: d.def.Proto()}}}
}

func (d *dflt) Type() cty.Type { return d.primary.Type() }
func (d *dflt) keys() []string { return d.primary.keys() }

func (d *dflt) decode(body map[string]interface{}, at string) (cty.Value, error) {
	v, err := d.primary.decode(body, at)
	if err != nil || !v.IsNull() {
		return v, err
	}
	return d.def.decode(body, at)
}

// Literal is a constant, written as the HCL expression the agent
// evaluates: a quoted string ("\"30s\""), a number or true/false. It
// panics on any other expression.
func Literal(expr string) Spec {
	var v cty.Value
	switch {
	case expr == "true" || expr == "false":
		v = cty.BoolVal(expr == "true")
	case strings.HasPrefix(expr, `"`):
		s, err := strconv.Unquote(expr)
		if err != nil {
			panic(fmt.Sprintf("configspec: literal %s: %v", expr, err))
		}
		v = cty.StringVal(s)
	default:
		n, err := cty.ParseNumberVal(expr)
		if err != nil {
			panic(fmt.Sprintf("configspec: literal %s: not a string, number or bool", expr))
		}
		v = n
	}
	return &literal{expr: expr, val: v}
}

// String is the Literal of s.
func String(s string) Spec { return Literal(strconv.Quote(s)) }

type literal struct {
	expr string
	val  cty.Value
}

func (l *literal) Proto() *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Literal{Literal: &hclspecpb.Literal{Value: l.expr}}}
}

func (l *literal) Type() cty.Type                                           { return l.val.Type() }
func (l *literal) keys() []string                                           { return nil }
func (l *literal) decode(map[string]interface{}, string) (cty.Value, error) { return l.val, nil }

// join names a field below at.
// a labelled block's fields follow a colon: `class "a": slots`, `nomad.address`.
func join(at, name string) string {
	switch {
	case at == "":
		return name
	case strings.HasSuffix(at, `"`):
		return at + ": " + name
	}
	return at + "." + name
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedSet(m map[string]bool) []string { return sortedKeys(m) }
