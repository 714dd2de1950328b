package view

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// This file is the read-only view of the slots for the operator CLI
// (`nomad-device-zfs status`): what the plugin would see, from ZFS alone,
// with nothing changed.

// Reader is what Observe needs from ZFS. *zfs.Client implements it.
type Reader interface {
	Get(ctx context.Context, name string, depth int, props ...string) ([]zfs.Dataset, error)
	PoolHealth(ctx context.Context, pool string) (string, error)
}

// Observation is one read-only look at the plugin's datasets.
type Observation struct {
	Pool string
	// PoolHealth is zpool's health (ONLINE, DEGRADED, …), or "" when the
	// pool could not be read: then PoolErr says why.
	PoolHealth string
	PoolErr    error
	// ParentErr says why the parent dataset could not be read (nil when
	// it was). Slots then holds every configured slot, unhealthy with the
	// reason.
	ParentErr error
	// Available is the parent's available space (what the pool, and any
	// quota on the parent, still lets its datasets write); AvailableKnown
	// is false when it was not read.
	Available      uint64
	AvailableKnown bool
	// Slots is every configured slot (and every in-use slot beyond the
	// count), sorted by class then index, with health as the plugin would
	// derive it from ZFS. What only the running plugin knows (an owner it
	// could not verify, a release that failed) is not in it.
	Slots []Slot
	// Old maps a slot ID to its previous dataset while that one is on its
	// way to the archive and the slot serves from its other name.
	Old map[string]string
	// Foreign lists datasets under the parent that are not the plugin's
	// (or no longer configured): the plugin reports them and never
	// touches them. Unreadable lists datasets whose properties do not
	// parse.
	Foreign    []string
	Unreadable []string
	// Archived counts the datasets in <parent>/.archive and the space
	// they use.
	Archived      int
	ArchivedBytes uint64
}

// Observe reads the pool's health and the parent's datasets (one `zpool
// list` and one `zfs get -r -d 2`) and derives the slots as the plugin
// would see them. It changes nothing: no dataset is created, mounted,
// repaired or released. An error is returned only when ctx ends; a pool
// or parent that cannot be read is part of the Observation.
func Observe(ctx context.Context, z Reader, cfg reconcile.Config) (Observation, error) {
	o := Observation{Pool: cfg.Pool(), Old: map[string]string{}}
	health, err := z.PoolHealth(ctx, o.Pool)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return o, fmt.Errorf("reading pool %s: %w", o.Pool, ctxErr)
	}
	unavailable := ""
	switch {
	case errors.Is(err, zfs.ErrNotExist):
		o.PoolErr = fmt.Errorf("pool %s is not imported: %w", o.Pool, err)
		unavailable = fmt.Sprintf("pool %s is not imported", o.Pool)
	case err != nil:
		o.PoolErr = fmt.Errorf("pool %s cannot be read: %w", o.Pool, err)
		unavailable = o.PoolErr.Error()
	default:
		o.PoolHealth = health
		if health != "ONLINE" {
			unavailable = fmt.Sprintf("pool %s is %s", o.Pool, health)
		}
	}
	var datasets []zfs.Dataset
	if o.PoolErr == nil {
		datasets, err = z.Get(ctx, cfg.Parent, 2, reconcile.ObservedProps...)
		datasets = (*armed.Tracker)(nil).Normalize(datasets, time.Time{}, cfg.Parent, 2, false) // as an outside observer
		if ctxErr := ctx.Err(); ctxErr != nil {
			return o, fmt.Errorf("reading %s: %w", cfg.Parent, ctxErr)
		}
		if err != nil {
			o.ParentErr = err
			if unavailable == "" {
				unavailable = ParentReason(cfg.Parent, err)
			}
		}
	} else {
		o.ParentErr = o.PoolErr
	}
	if o.ParentErr == nil {
		r := ParentRoomOf(cfg.Parent, datasets)
		o.Available, o.AvailableKnown = r.Bytes, r.Known
	}
	o.Slots = Build(cfg, datasets, unavailable, nil)
	for _, s := range o.Slots {
		if s.Old != nil {
			o.Old[s.ID] = s.Old.Dataset
		}
	}
	plan := reconcile.MakePlan(cfg, datasets, time.Now())
	o.Foreign = plan.Foreign
	for _, d := range plan.Unreadable {
		o.Unreadable = append(o.Unreadable, d.Name)
	}
	prefix := cfg.ArchiveDataset() + "/"
	for _, d := range datasets {
		if rest, ok := strings.CutPrefix(d.Name, prefix); ok && !strings.Contains(rest, "/") && d.Err == nil && record.IsManaged(d, record.ManagedSlot) {
			o.Archived++
			if n, err := d.Bytes("used"); err == nil {
				o.ArchivedBytes += n
			}
		}
	}
	return o, nil
}

// Present reports whether the slot's dataset exists (a configured slot
// whose dataset the plugin has not created yet is not present).
func (s Slot) Present() bool { return s.Exists }
