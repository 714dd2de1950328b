package configspec

import (
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/hclspecpb"
)

// FromProto is the Spec that p describes, as the agent reads the schema a
// plugin returns from ConfigSchema. It takes the kinds this package builds
// and refuses the others (Array, BlockList, BlockSet, type expressions
// other than string, number and bool) with an error naming them.
func FromProto(p *hclspecpb.Spec) (s Spec, err error) {
	defer func() {
		// The constructors panic on what they cannot build (a type
		// expression, a literal): from the wire, that is an error.
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("config schema: %v", r)
		}
	}()
	return fromProto(p, "the schema")
}

func fromProto(p *hclspecpb.Spec, at string) (Spec, error) {
	if p == nil {
		return nil, fmt.Errorf("config schema: %s: empty spec", at)
	}
	switch b := p.Block.(type) {
	case *hclspecpb.Spec_Object:
		attrs := map[string]Spec{}
		for k, v := range b.Object.GetAttributes() {
			s, err := fromProto(v, join(at, k))
			if err != nil {
				return nil, err
			}
			attrs[k] = s
		}
		return Object(attrs), nil
	case *hclspecpb.Spec_Attr:
		return Attr(b.Attr.GetName(), b.Attr.GetType(), b.Attr.GetRequired()), nil
	case *hclspecpb.Spec_BlockValue:
		nested, err := fromProto(b.BlockValue.GetNested(), join(at, b.BlockValue.GetName()))
		if err != nil {
			return nil, err
		}
		return Block(b.BlockValue.GetName(), b.BlockValue.GetRequired(), nested), nil
	case *hclspecpb.Spec_BlockMap:
		nested, err := fromProto(b.BlockMap.GetNested(), join(at, b.BlockMap.GetName()))
		if err != nil {
			return nil, err
		}
		return BlockMap(b.BlockMap.GetName(), b.BlockMap.GetLabels(), nested), nil
	case *hclspecpb.Spec_BlockAttrs:
		return BlockAttrs(b.BlockAttrs.GetName(), b.BlockAttrs.GetType(), b.BlockAttrs.GetRequired()), nil
	case *hclspecpb.Spec_Default:
		primary, err := fromProto(b.Default.GetPrimary(), at)
		if err != nil {
			return nil, err
		}
		def, err := fromProto(b.Default.GetDefault(), at)
		if err != nil {
			return nil, err
		}
		return Default(primary, def), nil
	case *hclspecpb.Spec_Literal:
		return Literal(b.Literal.GetValue()), nil
	}
	return nil, fmt.Errorf("config schema: %s: %T is not a kind this plugin's schema uses", at, p.Block)
}
