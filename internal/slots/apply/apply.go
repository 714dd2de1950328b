// Package apply carries out a plan's actions (package reconcile) on ZFS:
// the tree-wide actions and each slot's, a chain's later steps skipped
// when one fails, and a dataset's properties written with its state last.
// When each is carried out, and under which lock, is the slot manager's
// (package slots: sync.go, slot_work.go).
package apply

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/keys"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ZFS is what carrying out actions needs of ZFS (the manager's ZFS).
type ZFS interface {
	keys.ZFS
	Clone(ctx context.Context, snapshot, name string, props map[string]string) error
	Set(ctx context.Context, name, prop, value string) error
	SetMany(ctx context.Context, name string, props map[string]string) error
	Destroy(ctx context.Context, name string) error
	DestroyRecursive(ctx context.Context, name, within string) error
	Mount(ctx context.Context, name string) error
	MountLoadKey(ctx context.Context, name string) error
	Rename(ctx context.Context, from, to string) error
}

// Applier carries out actions through its ZFS, logging each. It has no
// state of its own.
type Applier struct {
	zfs ZFS
	log hclog.Logger
}

// New returns an Applier that reaches ZFS through z.
func New(z ZFS, log hclog.Logger) *Applier { return &Applier{zfs: z, log: log} }

// SetProps writes props on a dataset; the state goes last, so that a
// crash in between leaves the slot in its old state with the new facts.
func (p *Applier) SetProps(ctx context.Context, name string, props map[string]string) error {
	state, hasState := props[record.PropState]
	rest := maps.Clone(props)
	delete(rest, record.PropState)
	if len(rest) > 0 {
		if err := p.zfs.SetMany(ctx, name, rest); err != nil {
			return err
		}
	}
	if hasState {
		return p.zfs.Set(ctx, name, record.PropState, state)
	}
	return nil
}

// Split sorts a plan's actions into the tree-wide ones (class and
// archive containers) and those of each slot, by device ID. The steps left
// for a dataset in the archive belong to the slot it came from (its name
// starts with the device ID).
func Split(cfg reconcile.Config, actions []reconcile.Action) (tree []reconcile.Action, bySlot map[string][]reconcile.Action) {
	bySlot = map[string][]reconcile.Action{}
	for _, a := range actions {
		id := ""
		switch {
		case a.Kind == reconcile.CreateClass || a.Kind == reconcile.CreateArchive:
		case a.Index >= 0 && a.Class != "":
			id = record.DeviceID(a.Class, a.Index)
		default:
			if leaf, ok := strings.CutPrefix(a.Dataset, cfg.ArchiveDataset()+"/"); ok {
				id, _, _ = strings.Cut(leaf, ".")
			}
		}
		if id == "" {
			tree = append(tree, a)
			continue
		}
		bySlot[id] = append(bySlot[id], a)
	}
	return tree, bySlot
}

// All runs the actions in order and returns those that succeeded. A
// failed action records why in failed (by slot dataset) and skips the rest
// of its chain.
func (p *Applier) All(ctx context.Context, cfg reconcile.Config, actions []reconcile.Action, failed map[string]string) (done []reconcile.Action, errs []error) {
	broken := map[string]bool{}
	for _, a := range actions {
		if a.Chain != "" && broken[a.Chain] {
			continue
		}
		if err := p.One(ctx, cfg, a); err != nil {
			if a.Chain != "" {
				broken[a.Chain] = true
			}
			reason := fmt.Sprintf("%s failed: %v", a.Kind, err)
			switch {
			case errors.Is(err, zfs.ErrBusy):
				reason = fmt.Sprintf("%s: dataset is busy (a process still has it open); retrying", a.Kind)
			case errors.Is(err, zfs.ErrNoSpace):
				reason = fmt.Sprintf("%s: the pool is out of space (%v); retrying once space is freed", a.Kind, err)
			}
			p.log.Error("slot change failed", "action", a.Kind.String(), "dataset", a.Dataset, "error", err)
			failed[a.Dataset] = reason
			errs = append(errs, fmt.Errorf("%s %s: %w", a.Kind, a.Dataset, err))
			if a.Kind == reconcile.CreateClass {
				for i := 0; i < reconcile.ClassByName(cfg, a.Class).Slots; i++ {
					failed[cfg.SlotDataset(a.Class, i)] = fmt.Sprintf("%s %s failed: %v", a.Kind, a.Dataset, err)
				}
			}
			continue
		}
		p.log.Info("slot changed", "action", a.Kind.String(), "dataset", a.Dataset, "prop", a.Prop, "value", a.Value, "target", a.Target)
		done = append(done, a)
	}
	return done, errs
}

// DropFailed removes actions on datasets that already failed in this Sync,
// so that a dataset that cannot be changed is not retried within one Sync.
func DropFailed(actions []reconcile.Action, failed map[string]string) []reconcile.Action {
	out := actions[:0]
	for _, a := range actions {
		if _, bad := failed[a.Dataset]; !bad {
			out = append(out, a)
		}
	}
	return out
}

// One carries out one action on ZFS.
func (p *Applier) One(ctx context.Context, cfg reconcile.Config, a reconcile.Action) error {
	switch a.Kind {
	case reconcile.CreateSlot:
		c := reconcile.ClassByName(cfg, a.Class)
		switch {
		case c.Source != "":
			return p.zfs.Clone(ctx, c.Source, a.Dataset, a.Props)
		case c.Encrypted:
			return keys.Create(ctx, p.zfs, p.log, cfg.KeyDir, a)
		}
		return p.zfs.Create(ctx, a.Dataset, a.Props)
	case reconcile.CreateClass, reconcile.CreateArchive:
		return p.zfs.Create(ctx, a.Dataset, a.Props)
	case reconcile.DestroySlot:
		if a.CheckSource != "" {
			if _, err := p.zfs.GetExact(ctx, a.CheckSource, "guid"); err != nil {
				return fmt.Errorf("not made again (%s): source %s cannot be read, so the free dataset is kept: %w", a.Why, a.CheckSource, err)
			}
		}
		if err := p.zfs.Destroy(ctx, a.Dataset); err != nil {
			return err
		}
		return keys.Remove(p.log, cfg.KeyDir, a)
	case reconcile.SetQuota:
		return p.zfs.Set(ctx, a.Dataset, "refquota", a.Value)
	case reconcile.SetProp:
		return p.zfs.Set(ctx, a.Dataset, a.Prop, a.Value)
	case reconcile.MountSlot:
		if reconcile.ClassByName(cfg, a.Class).Encrypted {
			return p.zfs.MountLoadKey(ctx, a.Dataset)
		}
		return p.zfs.Mount(ctx, a.Dataset)
	case reconcile.Unmount:
		// One process unmounts it (never forced) and keeps it from being
		// mounted again by itself (reconcile.ReleaseSteps). When the
		// unmount fails (busy: a process still has the dataset open),
		// libzfs records nothing: canmount=noauto then, which unmounts
		// nothing, so that a reboot while the unmount waits does not
		// mount the released data again by itself.
		err := p.zfs.Set(ctx, a.Dataset, "canmount", "off")
		if err != nil && !errors.Is(err, zfs.ErrNotExist) {
			if serr := p.zfs.Set(context.WithoutCancel(ctx), a.Dataset, "canmount", "noauto"); serr != nil {
				p.log.Warn("released dataset's unmount (canmount=off) failed, and so did canmount=noauto", "dataset", a.Dataset, "error", serr)
			}
		}
		return err
	case reconcile.RenameToArchive:
		err := p.zfs.Rename(ctx, a.Dataset, a.Target)
		if errors.Is(err, zfs.ErrNoSpace) {
			return fmt.Errorf("%w (no room in %s, under its quota or in the pool: the data stays in its slot; with archive_quota, retention prunes the oldest archives to make room)", err, cfg.ArchiveDataset())
		}
		return err
	case reconcile.DestroyArchived:
		// -r only ever inside the plugin's own archive tree.
		if err := p.zfs.DestroyRecursive(ctx, a.Dataset, cfg.ArchiveDataset()); err != nil {
			return err
		}
		return keys.Remove(p.log, cfg.KeyDir, a)
	}
	return fmt.Errorf("unknown action %d", a.Kind)
}
