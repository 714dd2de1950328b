package zfs

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Prop is one property of one dataset as `zfs get -H -p` prints it.
type Prop struct {
	Value string
	// Source is "local", "default", "-", "received", "temporary" or
	// "inherited from <dataset>".
	Source string
}

// Dataset holds the properties that one `zfs get` returned for one dataset.
type Dataset struct {
	Name  string
	Props map[string]Prop
	// Err is nil when every line of the dataset parsed cleanly. Otherwise
	// it says what was wrong (and matches ErrMalformed), and Props must not
	// be trusted: values may be cut short, missing, or forged by the text of
	// another dataset's property value. GetExact reads one property exactly.
	Err error
}

// Value returns the property's value; ok is false when the property is
// absent or unset ("-").
func (d Dataset) Value(prop string) (value string, ok bool) {
	p, found := d.Props[prop]
	if !found || p.Value == "-" {
		return "", false
	}
	return p.Value, true
}

// Local returns the property's value only when it is set on this dataset
// itself (source "local" or "received"), not inherited from a parent. User
// properties are inherited by children and snapshots, so ownership marks must
// be read with Local.
func (d Dataset) Local(prop string) (value string, ok bool) {
	p, found := d.Props[prop]
	if !found || p.Value == "-" || (p.Source != "local" && p.Source != "received") {
		return "", false
	}
	return p.Value, true
}

// Bytes returns a numeric property (as printed with -p) in bytes.
func (d Dataset) Bytes(prop string) (uint64, error) {
	v, ok := d.Value(prop)
	if !ok {
		return 0, fmt.Errorf("dataset %s: property %s is not set", d.Name, prop)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("dataset %s: property %s: %q is not a number of bytes", d.Name, prop, v)
	}
	return n, nil
}

// ParsePoolHealth parses `zpool list -H -o name,health POOL` and returns the
// health of pool ("ONLINE", "DEGRADED", "FAULTED", ...).
func ParsePoolHealth(out []byte, pool string) (string, error) {
	for i, line := range strings.Split(string(out), "\n") {
		if line == "" {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 2 {
			return "", fmt.Errorf("zpool list output line %d: want 2 tab-separated fields (name, health), got %d: %q", i+1, len(fields), line)
		}
		if fields[0] == pool {
			return fields[1], nil
		}
	}
	return "", fmt.Errorf("zpool list output has no line for pool %q", pool)
}

// ParseRatio parses a compression ratio as zfs prints it: "1.50x" (zfs-fuse,
// and OpenZFS without -p) or "1.50" (OpenZFS with -p).
func ParseRatio(s string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "x"), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%q is not a compression ratio", s)
	}
	return f, nil
}

// ParseSize parses a size the way zfs reads one: a bare number is bytes; the
// suffixes K, M, G, T, P, E (optionally followed by "B" or "iB", any case) are
// powers of 1024. Fractions are allowed with a suffix ("1.5G"). Zero and
// negative sizes are rejected.
func ParseSize(s string) (uint64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, fmt.Errorf("size is empty")
	}
	i := 0
	for i < len(in) && (in[i] >= '0' && in[i] <= '9' || in[i] == '.') {
		i++
	}
	num, suffix := in[:i], strings.ToUpper(strings.TrimSpace(in[i:]))
	if num == "" {
		return 0, fmt.Errorf("size %q does not start with a number", s)
	}
	suffix = strings.TrimSuffix(strings.TrimSuffix(suffix, "B"), "I")
	shift := 0
	switch suffix {
	case "":
	case "K":
		shift = 10
	case "M":
		shift = 20
	case "G":
		shift = 30
	case "T":
		shift = 40
	case "P":
		shift = 50
	case "E":
		shift = 60
	default:
		return 0, fmt.Errorf("size %q has an unknown unit (want a number of bytes, or K, M, G, T, P, E, optionally with B or iB)", s)
	}
	if shift == 0 {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("size %q: a size without a unit must be a whole number of bytes", s)
		}
		if n == 0 {
			return 0, fmt.Errorf("size %q must be greater than zero", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %q is not a number", s, num)
	}
	v := f * float64(uint64(1)<<shift)
	if v < 1 {
		return 0, fmt.Errorf("size %q must be at least one byte", s)
	}
	if v >= math.MaxUint64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(v), nil
}
