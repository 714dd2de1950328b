package record

import (
	"strconv"
	"strings"
)

// A slot has two dataset names, <parent>/<class>/<index> and
// <parent>/<class>/<index>.alt (see package slots/reconcile, pair.go); its Nomad
// device instance is <class>-<index>.

// AltSuffix ends the second dataset name of a slot.
const AltSuffix = ".alt"

// DeviceID returns the Nomad device instance ID of a slot: "<class>-<index>".
func DeviceID(class string, index int) string { return class + "-" + strconv.Itoa(index) }

// SlotIndex returns the slot index that a dataset's last name component
// spells ("0", "17", "3.alt"; not "007" or "-1") and whether it is the
// alternate name; -1 when it spells none.
func SlotIndex(comp string) (index int, alt bool) {
	if base, ok := strings.CutSuffix(comp, AltSuffix); ok {
		return ParseIndex(base), true
	}
	return ParseIndex(comp), false
}

// ParseIndex returns the slot index that a name component spells ("0",
// "17"; not "007" or "-1"), or -1.
func ParseIndex(comp string) int {
	n, err := strconv.Atoi(comp)
	if err != nil || n < 0 || strconv.Itoa(n) != comp {
		return -1
	}
	return n
}

// ShortID is the first 8 characters of a Nomad ID, as logs and archive
// names show it.
func ShortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
