package configspec

import (
	"testing"

	"github.com/shoenig/test/must"
	"github.com/zclconf/go-cty/cty"
	"google.golang.org/protobuf/proto"
)

// spec is a schema with every kind this package builds.
var spec = Object(map[string]Spec{
	"name":   Attr("name", "string", true),
	"period": Default(Attr("period", "string", false), String("30s")),
	"count":  Attr("count", "number", false),
	"on":     Default(Attr("on", "bool", false), Literal("true")),
	"net": Block("net", false, Object(map[string]Spec{
		"addr": Attr("addr", "string", false),
	})),
	"class": BlockMap("class", []string{"name"}, Object(map[string]Spec{
		"slots": Attr("slots", "number", true),
		"props": BlockAttrs("props", "string", false),
	})),
})

// TestFromAgent: the shapes the agent's HCL 1 and JSON decoding give, with
// the agent's conversions and defaults, and the errors, naming the field,
// for what the agent refuses.
func TestFromAgent(t *testing.T) {
	class := func(slots cty.Value, props cty.Value) cty.Value {
		return cty.ObjectVal(map[string]cty.Value{"slots": slots, "props": props})
	}
	noProps := cty.NullVal(cty.Map(cty.String))
	cases := []struct {
		name    string
		body    map[string]interface{}
		want    map[string]cty.Value // attributes of the result that matter
		wantErr string
	}{
		{
			name: "defaults filled in, absent blocks null, no classes an empty map",
			body: map[string]interface{}{"name": "x"},
			want: map[string]cty.Value{
				"period": cty.StringVal("30s"), "on": cty.True, "count": cty.NullVal(cty.Number),
				"net":   cty.NullVal(cty.Object(map[string]cty.Type{"addr": cty.String})),
				"class": cty.MapValEmpty(class(cty.NullVal(cty.Number), noProps).Type()),
			},
		},
		{
			name: "HCL 1 shapes: blocks as lists of maps, labels as one-key maps, properties = {} as a list of one map",
			body: map[string]interface{}{
				"name": "x", "count": 3, "on": false,
				"net": []map[string]interface{}{{"addr": "a"}},
				"class": []map[string]interface{}{
					{"a": []map[string]interface{}{{"slots": 2, "props": []map[string]interface{}{{"k": "v"}}}}},
					{"b": []map[string]interface{}{{"slots": 1}}},
				},
			},
			want: map[string]cty.Value{
				"count": cty.NumberIntVal(3), "on": cty.False,
				"net": cty.ObjectVal(map[string]cty.Value{"addr": cty.StringVal("a")}),
				"class": cty.MapVal(map[string]cty.Value{
					"a": class(cty.NumberIntVal(2), cty.MapVal(map[string]cty.Value{"k": cty.StringVal("v")})),
					"b": class(cty.NumberIntVal(1), noProps),
				}),
			},
		},
		{
			name: "JSON shapes: maps for blocks and labels, an empty properties block",
			body: map[string]interface{}{
				"name":  "x",
				"net":   map[string]interface{}{"addr": "a"},
				"class": map[string]interface{}{"a": map[string]interface{}{"slots": 2.0, "props": map[string]interface{}{}}},
			},
			want: map[string]cty.Value{
				"class": cty.MapVal(map[string]cty.Value{"a": class(cty.NumberIntVal(2), cty.MapValEmpty(cty.String))}),
			},
		},
		{
			name: "escaped template sequences read as the agent reads them",
			body: map[string]interface{}{"name": "$${foo} %%{bar} $ % {}"},
			want: map[string]cty.Value{"name": cty.StringVal("${foo} %{bar} $ % {}")},
		},
		{
			name: "the agent's conversions: strings to numbers and bools, numbers to strings",
			body: map[string]interface{}{"name": 7, "count": "12", "on": "false"},
			want: map[string]cty.Value{"name": cty.StringVal("7"), "count": cty.NumberIntVal(12), "on": cty.False},
		},
		{name: "required attribute", body: map[string]interface{}{}, wantErr: "name is required"},
		{name: "required in a labelled block", body: map[string]interface{}{"name": "x", "class": map[string]interface{}{"a": map[string]interface{}{}}},
			wantErr: `class "a": slots is required`},
		{name: "unknown field", body: map[string]interface{}{"name": "x", "nmae": "y"}, wantErr: "nmae: unknown field; the fields here are class, count, name, net, on, period"},
		{name: "unknown field in a block", body: map[string]interface{}{"name": "x", "net": map[string]interface{}{"adr": "a"}}, wantErr: "net.adr: unknown field"},
		{name: "not a number", body: map[string]interface{}{"name": "x", "count": "many"}, wantErr: `count = "many": want a number`},
		{name: "not a bool", body: map[string]interface{}{"name": "x", "on": "yes"}, wantErr: `on = "yes": want a bool`},
		{name: "a list for an attribute", body: map[string]interface{}{"name": []interface{}{"x"}}, wantErr: "name: want a string, got a list or block"},
		{name: "two single blocks", body: map[string]interface{}{"name": "x", "net": []map[string]interface{}{{}, {}}}, wantErr: "net: only one such block is allowed, found 2"},
		{name: "a label twice", body: map[string]interface{}{"name": "x", "class": []map[string]interface{}{
			{"a": []map[string]interface{}{{"slots": 1}}}, {"a": []map[string]interface{}{{"slots": 2}}}}},
			wantErr: `class "a": defined more than once`},
		{name: "a value for a block", body: map[string]interface{}{"name": "x", "net": "a"}, wantErr: `net: want a block, got "a"`},
		{name: "a template the agent would evaluate or refuse", body: map[string]interface{}{"name": "/data/${NOMAD_ALLOC_ID}"},
			wantErr: `name = "/data/${NOMAD_ALLOC_ID}": the string holds an HCL template`},
		{name: "a template directive", body: map[string]interface{}{"name": "%{ if true }x%{ endif }"}, wantErr: "the string holds an HCL template"},
		{name: "a value in a property block", body: map[string]interface{}{"name": "x", "class": map[string]interface{}{
			"a": map[string]interface{}{"slots": 1, "props": map[string]interface{}{"k": []interface{}{"v"}}}}},
			wantErr: `class "a": props.k: want a string`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromAgent(spec, tc.body)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.True(t, got.Type().Equals(spec.Type()), must.Sprintf("type %s", got.Type().GoString()))
			for k, want := range tc.want {
				must.True(t, want.RawEquals(got.GetAttr(k)), must.Sprintf("%s: want %#v, got %#v", k, want, got.GetAttr(k)))
			}
		})
	}
}

// TestProtoRoundTrip: the schema as the agent receives it reads back to a
// schema of the same type that sends the same message.
func TestProtoRoundTrip(t *testing.T) {
	back, err := FromProto(spec.Proto())
	must.NoError(t, err)
	must.True(t, back.Type().Equals(spec.Type()))
	must.True(t, proto.Equal(spec.Proto(), back.Proto()))
}

func TestFromProtoRefusesWhatItCannotRead(t *testing.T) {
	list := Attr("x", "string", false).Proto()
	list.GetAttr().Type = "list(string)"
	_, err := FromProto(list)
	must.ErrorContains(t, err, `type "list(string)": only string, number and bool are supported`)
	_, err = FromProto(nil)
	must.ErrorContains(t, err, "empty spec")
	lit := String("x").Proto()
	lit.GetLiteral().Value = "upper(x)"
	_, err = FromProto(lit)
	must.ErrorContains(t, err, "not a string, number or bool")
}

// decoded lacks the tag of its Class field.
type decoded struct {
	Name   string  `cty:"name"`
	Period string  `cty:"period"`
	Count  *int    `cty:"count"`
	On     bool    `cty:"on"`
	Net    *netCfg `cty:"net"`
	Class  map[string]*classCfg
}

type netCfg struct {
	Addr string `cty:"addr"`
}

type classCfg struct {
	Slots int               `cty:"slots"`
	Props map[string]string `cty:"props"`
}

// TestDecode: the plugin's side reads what the agent's side encoded; nulls
// leave zero values and nil pointers; a struct without a field for an
// attribute, and a number that is not whole for an int, are errors naming
// the attribute.
func TestDecode(t *testing.T) {
	val, err := FromAgent(spec, map[string]interface{}{
		"name": "x", "class": map[string]interface{}{"a": map[string]interface{}{"slots": 2, "props": map[string]interface{}{"k": "v"}}},
	})
	must.NoError(t, err)
	b, err := Encode(val)
	must.NoError(t, err)

	var got struct {
		Name   string               `cty:"name"`
		Period string               `cty:"period"`
		Count  *int                 `cty:"count"`
		On     bool                 `cty:"on"`
		Net    *netCfg              `cty:"net"`
		Class  map[string]*classCfg `cty:"class"`
	}
	must.NoError(t, Decode(spec, b, &got))
	must.Eq(t, "x", got.Name)
	must.Eq(t, "30s", got.Period)
	must.Nil(t, got.Count)
	must.True(t, got.On)
	must.Nil(t, got.Net)
	must.Eq(t, map[string]*classCfg{"a": {Slots: 2, Props: map[string]string{"k": "v"}}}, got.Class)

	var missing decoded // Class has no tag
	must.ErrorContains(t, Decode(spec, b, &missing), "class: no field takes it")

	half, err := FromAgent(spec, map[string]interface{}{"name": "x", "class": map[string]interface{}{"a": map[string]interface{}{"slots": 2.5}}})
	must.NoError(t, err)
	b, err = Encode(half)
	must.NoError(t, err)
	must.ErrorContains(t, Decode(spec, b, &got), `class "a": slots = 2.5: want a whole number`)

	huge, err := FromAgent(spec, map[string]interface{}{"name": "x", "class": map[string]interface{}{"a": map[string]interface{}{"slots": "99999999999999999999999"}}})
	must.NoError(t, err)
	b, err = Encode(huge)
	must.NoError(t, err)
	must.ErrorContains(t, Decode(spec, b, &got), `class "a": slots = 99999999999999999999999: out of range`)

	must.ErrorContains(t, Decode(spec, nil, &got), "no config was sent")
	must.ErrorContains(t, Decode(spec, []byte{0xc1}, &got), "decoding the config")
	must.ErrorContains(t, Decode(spec, b, got), "not a non-nil pointer")
}
