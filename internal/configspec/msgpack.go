package configspec

import (
	"fmt"
	"math/big"
	"reflect"
	"sort"

	"github.com/zclconf/go-cty/cty"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"
)

// Encode is what the agent sends to SetConfig for val: go-cty's msgpack
// encoding of it, with its own type.
func Encode(val cty.Value) ([]byte, error) {
	b, err := ctymsgpack.Marshal(val, val.Type())
	if err != nil {
		return nil, fmt.Errorf("encoding the config: %w", err)
	}
	return b, nil
}

// Decode reads what the agent sent to SetConfig (b, a msgpack-encoded
// value of spec's type) into target, a pointer to a struct whose fields
// carry `cty:"name"` tags, one per attribute of spec. Within it:
//
//   - string, bool, int (a whole number in range) and float64 fields
//     take attributes of those types; a null leaves the zero value;
//   - a pointer field is nil for a null, so that "not given" and a zero
//     value differ;
//   - a struct or pointer-to-struct field takes an object (a block);
//   - a map[string]T field takes a map (a block map, block attributes).
//
// An attribute without a field is an error, so a schema and its struct
// cannot drift apart unnoticed. Errors name the attribute's path.
func Decode(spec Spec, b []byte, target interface{}) error {
	if len(b) == 0 {
		return fmt.Errorf("no config was sent")
	}
	val, err := ctymsgpack.Unmarshal(b, spec.Type())
	if err != nil {
		return fmt.Errorf("decoding the config: %w", err)
	}
	return FromValue(val, target)
}

// FromValue is Decode's second half: val into target.
func FromValue(val cty.Value, target interface{}) error {
	rv := reflect.ValueOf(target)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("configspec: decoding into %T, not a non-nil pointer", target)
	}
	return assign(val, rv.Elem(), "")
}

// assign stores val in dst; at names it for errors.
func assign(val cty.Value, dst reflect.Value, at string) error {
	if !val.IsKnown() {
		return fmt.Errorf("%s: the value is not known", name(at))
	}
	if val.IsNull() {
		dst.Set(reflect.Zero(dst.Type()))
		return nil
	}
	if dst.Kind() == reflect.Pointer {
		p := reflect.New(dst.Type().Elem())
		if err := assign(val, p.Elem(), at); err != nil {
			return err
		}
		dst.Set(p)
		return nil
	}
	t := val.Type()
	switch {
	case dst.Kind() == reflect.String && t == cty.String:
		dst.SetString(val.AsString())
	case dst.Kind() == reflect.Bool && t == cty.Bool:
		dst.SetBool(val.True())
	case dst.Kind() == reflect.Int && t == cty.Number:
		bf := val.AsBigFloat()
		if !bf.IsInt() {
			return fmt.Errorf("%s = %s: want a whole number", name(at), bf.Text('g', -1))
		}
		i, acc := bf.Int64()
		if acc != big.Exact || int64(int(i)) != i {
			return fmt.Errorf("%s = %s: out of range", name(at), bf.Text('f', 0))
		}
		dst.SetInt(i)
	case dst.Kind() == reflect.Float64 && t == cty.Number:
		f, _ := val.AsBigFloat().Float64()
		dst.SetFloat(f)
	case dst.Kind() == reflect.Struct && t.IsObjectType():
		return assignStruct(val, dst, at)
	case dst.Kind() == reflect.Map && dst.Type().Key().Kind() == reflect.String && (t.IsMapType() || t.IsObjectType()):
		m := reflect.MakeMapWithSize(dst.Type(), val.LengthInt())
		for it := val.ElementIterator(); it.Next(); {
			k, v := it.Element()
			e := reflect.New(dst.Type().Elem()).Elem()
			if err := assign(v, e, fmt.Sprintf("%s %q", at, k.AsString())); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(k.AsString()).Convert(dst.Type().Key()), e)
		}
		dst.Set(m)
	default:
		return fmt.Errorf("%s: a %s cannot be stored in a Go %s", name(at), t.FriendlyName(), dst.Type())
	}
	return nil
}

// assignStruct stores an object's attributes in the tagged fields of dst.
func assignStruct(val cty.Value, dst reflect.Value, at string) error {
	fields := map[string]int{}
	for i := 0; i < dst.NumField(); i++ {
		if tag, ok := dst.Type().Field(i).Tag.Lookup("cty"); ok {
			fields[tag] = i
		}
	}
	attrs := val.Type().AttributeTypes()
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		i, ok := fields[k]
		if !ok {
			return fmt.Errorf("%s: no field takes it", join(at, k))
		}
		if err := assign(val.GetAttr(k), dst.Field(i), join(at, k)); err != nil {
			return err
		}
	}
	return nil
}

// name is at for an error ("the config" at the top).
func name(at string) string {
	if at == "" {
		return "the config"
	}
	return at
}
