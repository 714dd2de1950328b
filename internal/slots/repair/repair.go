// Package repair re-reads, one property per command, the datasets of the
// slot manager's batched read that did not parse, and cleans the legacy
// owner properties that made them so. The manager calls it from its
// converge (slots/sync.go) whenever a read has such datasets
// (Unreadable), and says what an armed state means of the result.
package repair

import (
	"context"
	"errors"
	"fmt"
	"slices"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// maxRepairs bounds the datasets one Sync re-reads one property at a time.
const maxRepairs = 8

// ZFS is what a repair asks of ZFS (the zfs package's Client).
type ZFS interface {
	GetExact(ctx context.Context, name, prop string) (zfs.Prop, error)
	Set(ctx context.Context, name, prop, value string) error
}

// Datasets re-reads, one property per command, the datasets of a batched
// read that did not parse (a value with TABs or newlines: written by an
// earlier version, or by hand), so that each gets its exact values. A name
// that does not exist (a line forged inside such a value) is dropped. On a
// dataset the plugin manages, a legacy owner property holding control
// characters is rewritten with them replaced, so that the next batched read
// parses. This costs processes only while such datasets exist, and at most
// maxRepairs datasets per call; the others stay unreadable (left alone,
// their slots unhealthy) until a later call.
//
// The exact reads are raw: what an armed state means is for the caller to
// say, with every dataset of the read beside them (a spare's sibling).
func Datasets(ctx context.Context, z ZFS, log hclog.Logger, datasets []zfs.Dataset) []zfs.Dataset {
	out := datasets[:0:0]
	n := 0
	for _, d := range datasets {
		if d.Err == nil {
			out = append(out, d)
			continue
		}
		if n == maxRepairs {
			out = append(out, d)
			continue
		}
		n++
		fixed, exists, err := readExact(ctx, z, log, d.Name)
		switch {
		case err != nil:
			d.Err = errors.Join(d.Err, err)
			out = append(out, d)
		case exists:
			out = append(out, fixed)
		}
	}
	return out
}

// readExact reads every observed property of name exactly, and cleans the
// legacy owner properties of a managed dataset.
func readExact(ctx context.Context, z ZFS, log hclog.Logger, name string) (zfs.Dataset, bool, error) {
	d := zfs.Dataset{Name: name, Props: map[string]zfs.Prop{}}
	for _, p := range reconcile.ObservedProps {
		v, err := z.GetExact(ctx, name, p)
		if errors.Is(err, zfs.ErrNotExist) {
			return d, false, nil
		}
		if err != nil {
			return d, true, fmt.Errorf("reading %s of %s exactly: %w", p, name, err)
		}
		d.Props[p] = v
	}
	if _, managed := d.Local(record.PropManaged); !managed {
		return d, true, nil
	}
	for _, p := range record.LegacyOwnerProps {
		v, ok := d.Local(p)
		if !ok || view.OneLine(v) == v {
			continue
		}
		clean := view.OneLine(v)
		if err := z.Set(ctx, name, p, clean); err != nil {
			return d, true, fmt.Errorf("rewriting %s of %s without control characters: %w", p, name, err)
		}
		log.Warn("rewrote a property that held control characters", "dataset", name, "property", p,
			"was", fmt.Sprintf("%q", v), "now", clean)
		d.Props[p] = zfs.Prop{Value: clean, Source: d.Props[p].Source}
	}
	return d, true, nil
}

// Unreadable reports whether any dataset did not parse.
func Unreadable(ds []zfs.Dataset) bool {
	return slices.ContainsFunc(ds, func(d zfs.Dataset) bool { return d.Err != nil })
}
