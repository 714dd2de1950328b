package record

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestSlotIndex(t *testing.T) {
	type got struct {
		index int
		alt   bool
	}
	for in, want := range map[string]got{
		"0": {0, false}, "12": {12, false}, "007": {-1, false}, "-1": {-1, false}, "x": {-1, false}, "": {-1, false}, "1a": {-1, false},
		"3.alt": {3, true}, "03.alt": {-1, true}, ".alt": {-1, true}, "3.alt.alt": {-1, true}, "3.ALT": {-1, false},
	} {
		i, alt := SlotIndex(in)
		must.Eq(t, want, got{i, alt}, must.Sprintf("%q", in))
	}
}
