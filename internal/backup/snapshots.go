package backup

// The keeper's own snapshots: released once the next increment no longer
// needs them, wherever they went with their dataset.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// sweepSlots releases the keeper's older snapshots that came back into
// slots with their archives (a restore renames the archive, snapshots and
// all, often while its pass sends it, so that the pass cannot release
// them), or that a live backup whose send failed left: one read per class
// with restore on of its slots' snapshots, then, on each slot dataset that
// holds more than one of the keeper's, a destroy of all but the newest
// that backup_dir holds (the next increment's base; the newest of all when
// backup_dir holds none of them). Only the keeper's own snapshots ever go,
// never the tenant's data.
func (k *Keeper) sweepSlots(ctx context.Context, cfg Config) error {
	classes := make([]string, 0, len(cfg.ClassDatasets))
	for c := range cfg.ClassDatasets {
		if cfg.Classes[c] {
			classes = append(classes, c)
		}
	}
	slices.Sort(classes)
	// What backup_dir holds, read once and only when a slot needs it.
	var inDir map[uint64]bool
	held := func(guid uint64) bool {
		if inDir == nil {
			inDir = map[uint64]bool{}
			ms, _, err := List(cfg.Dir, nil)
			if err != nil {
				k.log.Warn("backup_dir not read for the slots' snapshots; the newest of each is kept", "error", err)
			}
			for _, m := range ms {
				inDir[m.GUID] = true
			}
		}
		return inDir[guid]
	}
	newestHeld := func(_ string, mine []zfs.Snap) string {
		for i := len(mine) - 1; i >= 0; i-- {
			if held(mine[i].GUID) {
				return mine[i].Name
			}
		}
		return mine[len(mine)-1].Name
	}
	var errs []error
	for _, c := range classes {
		if err := k.sweepUnder(ctx, cfg.ClassDatasets[c], newestHeld); err != nil {
			errs = append(errs, fmt.Errorf("reading the snapshots of class %q's slots: %w", c, err))
		}
	}
	return errors.Join(errs...)
}

// sweepUnder reads the snapshots of every dataset under container at once
// and, on each that holds more than one of the keeper's (mine, oldest
// first), destroys all of them but the one keep picks ("": none goes).
func (k *Keeper) sweepUnder(ctx context.Context, container string, keep func(dataset string, mine []zfs.Snap) string) error {
	under, err := k.zfs.SnapshotsUnder(ctx, container)
	if errors.Is(err, zfs.ErrNotExist) {
		return nil // nothing there yet
	}
	if err != nil {
		return err
	}
	names := make([]string, 0, len(under))
	for n := range under {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		var mine []zfs.Snap
		for _, s := range under[n] {
			if strings.HasPrefix(s.Name, n+"@"+SnapshotPrefix) {
				mine = append(mine, s)
			}
		}
		if len(mine) < 2 {
			continue
		}
		if kept := keep(n, mine); kept != "" {
			k.destroyOlder(ctx, mine, n, kept)
		}
	}
	return nil
}

// pendingRelease is a dataset's older snapshots of the keeper's, to go
// once its pass has sent what it sends.
type pendingRelease struct {
	snaps         []zfs.Snap
	dataset, keep string
}

// releasePending destroys what the pass's sends left to release (see
// releaseSnapshots). Only passes (under passMu) call it.
func (k *Keeper) releasePending(ctx context.Context) {
	for _, p := range k.pending {
		k.destroyOlder(ctx, p.snaps, p.dataset, p.keep)
	}
	k.pending = nil
}

// sweep releases the keeper's older snapshots of archives already in
// backup_dir that a pass could not release when it sent them (the archive
// renamed into a slot by a restore meanwhile, and back; a destroy ZFS
// refused): one read of every archive's snapshots, then, on each archive
// that is marked (archives, as read before the pass, and sent, its
// backups) and holds more than one of the keeper's, a destroy of all but
// its mark, the base of its next increment.
func (k *Keeper) sweep(ctx context.Context, container string, archives []retention.Archive, sent []Manifest) error {
	marked := map[string]uint64{}
	for _, a := range archives {
		if g, err := strconv.ParseUint(a.Backup, 10, 64); err == nil {
			marked[a.Name] = g
		}
	}
	for _, m := range sent {
		if !m.Live {
			marked[m.Dataset] = m.GUID
		}
	}
	err := k.sweepUnder(ctx, container, func(n string, mine []zfs.Snap) string {
		mark, ok := marked[n]
		for _, s := range mine {
			if ok && s.GUID == mark {
				return s.Name
			}
		}
		return "" // not marked, or its mark is not there: left alone
	})
	if err != nil {
		return fmt.Errorf("reading the archives' snapshots: %w", err)
	}
	return nil
}

// releaseSnapshots destroys the keeper's own snapshots of dataset but keep,
// the newest one backup_dir holds: the base of the next increment, the
// only one a later send needs. So the keeper's snapshots on a dataset stay
// at one between passes, however often it comes back and goes again,
// rather than pile up outside its quota. A snapshot that cannot be
// destroyed (ZFS refuses, say, one with a clone) is logged and tried again
// at the dataset's next backup; the backup itself stands.
func (k *Keeper) releaseSnapshots(ctx context.Context, dataset, keep string) {
	snaps, err := k.zfs.Snapshots(ctx, dataset)
	if err != nil {
		k.log.Warn("the keeper's older snapshots were not read; they go at the next backup", "dataset", dataset, "error", err)
		return
	}
	k.destroyOlder(ctx, snaps, dataset, keep)
}

// destroyOlder is releaseSnapshots over snaps, the snapshots of dataset as
// read.
func (k *Keeper) destroyOlder(ctx context.Context, snaps []zfs.Snap, dataset, keep string) {
	for _, s := range snaps {
		if s.Name == keep || !strings.HasPrefix(s.Name, dataset+"@"+SnapshotPrefix) {
			continue
		}
		if err := k.zfs.DestroySnapshot(ctx, s.Name); errors.Is(err, zfs.ErrNotExist) {
			// Renamed with its dataset since the read (a restore took
			// the archive): its next backup, or a later sweep, releases
			// it.
			k.log.Debug("an older snapshot of the keeper's moved before its release", "snapshot", s.Name, "error", err)
			continue
		} else if err != nil {
			k.log.Warn("an older snapshot of the keeper's was not destroyed; tried again at the next pass", "snapshot", s.Name, "error", err)
			continue
		}
		k.log.Debug("older snapshot released", "snapshot", s.Name, "kept", keep)
	}
}
