package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// maxRounds bounds the observe-and-act rounds of one Sync. A release takes
// one round, the fresh dataset's owner and mode a second look.
const maxRounds = 3

// Sync observes ZFS and brings it to the configuration: it creates missing
// class datasets and slots, mounts free slots that are not mounted, destroys
// free slots beyond the count, fixes the quota, root directory owner and
// mode and mount flags of free slots, and carries every started release to
// its end (archive or destroy, then a fresh dataset). It runs one `zpool
// list` and one batched `zfs get`, plus, only when it changed something,
// one command per change and one more `zfs get`. When the pool is not
// ONLINE or the parent is missing it changes nothing and marks every slot
// unhealthy. On return the slot list reflects what ZFS said; the error
// reports changes that failed (their slots are unhealthy).
//
// Sync never waits for slot work: it changes a slot only under the slot's
// lock taken when free (TryLock), and leaves a slot whose lock is held, or
// that slot work changed while Sync read ZFS, to that work (its view of the
// slot is kept). The class and archive containers are created only when no
// slot work runs. Syncs run one at a time (syncMu).
func (m *Manager) Sync(ctx context.Context) error {
	return m.sync(ctx, "")
}

// sync is Sync for the run of slot mine (none when ""), which falls back
// to it: the run's own registration does not keep it off that slot.
func (m *Manager) sync(ctx context.Context, mine string) error {
	m.syncMu.Lock()
	defer m.syncMu.Unlock()
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()

	reason, err := m.checkPool(ctx, cfg)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	if reason != "" {
		m.setUnavailable(cfg, reason)
		return nil
	}
	vers := m.versions()
	var (
		errs    []error
		failed  = make(map[string]string)
		skipped = make(map[string]bool) // slot IDs left to slot work
	)
	read := func(ctx context.Context) ([]zfs.Dataset, error) {
		return m.zfs.Get(ctx, cfg.Parent, 2, ObservedProps...)
	}
	datasets, err := m.converge(ctx, cfg, read, func(plan Plan) bool {
		m.setArchiveReady(plan.ArchiveReady, plan.ArchiveUnmounted)
		m.reportForeign(m.settled(cfg, plan.Foreign, vers))
		m.reportUnreadable(plan.Unreadable)
		tree, bySlot := splitActions(cfg, dropFailed(plan.Actions, failed))
		for id := range bySlot {
			if skipped[id] {
				delete(bySlot, id)
			}
		}
		if len(tree) == 0 && len(bySlot) == 0 {
			return false
		}
		if len(tree) > 0 {
			if m.treeMu.TryLock() {
				_, errs2 := m.applyAll(ctx, cfg, tree, failed)
				m.treeMu.Unlock()
				errs = append(errs, errs2...)
			} else if len(bySlot) == 0 {
				m.log.Debug("slot work in progress; creating containers at the next sync")
				return false
			}
		}
		for _, id := range slices.Sorted(maps.Keys(bySlot)) {
			unlock, ok := m.tryLockSlot(id, mine)
			if !ok {
				skipped[id] = true
				continue
			}
			if m.version(id) != vers[id] {
				unlock()
				skipped[id] = true
				continue
			}
			_, errs2 := m.applyAll(ctx, cfg, bySlot[id], failed)
			unlock()
			errs = append(errs, errs2...)
		}
		return true
	})
	if err != nil {
		m.setUnavailable(cfg, parentReason(cfg.Parent, err))
		return errors.Join(errs...)
	}

	slots := buildSlots(cfg, datasets, "", failed)
	errs = append(errs, m.prepareFreeUnlocked(cfg, slots, skipped, mine, vers)...)
	m.mu.Lock()
	for i, s := range slots {
		if skipped[s.ID] || m.busy[s.ID] > 0 || m.vers[s.ID] != vers[s.ID] {
			if j, ok := m.byID[s.ID]; ok {
				slots[i] = m.slots[j]
			}
		}
	}
	m.forgetFatesLocked(slots)
	m.setSlotsLocked(slots)
	m.usageAt = time.Now()
	m.parentRoom = parentRoomOf(cfg.Parent, datasets)
	m.mu.Unlock()
	return errors.Join(errs...)
}

// converge runs rounds of observe → plan → apply, the loop of both Sync and
// a slot's release: read observes ZFS (repairing what did not parse), the
// plan is made from what it said, and act applies the part of the plan
// that is the caller's, returning false when there was nothing to do. It
// stops there, or after maxRounds rounds, and returns the last read.
func (m *Manager) converge(ctx context.Context, cfg Config, read func(context.Context) ([]zfs.Dataset, error), act func(Plan) bool) ([]zfs.Dataset, error) {
	for round := 0; ; round++ {
		datasets, err := read(ctx)
		if err != nil {
			return nil, err
		}
		if hasUnreadable(datasets) {
			datasets = m.repair(ctx, datasets)
		}
		if round == maxRounds || !act(MakePlan(cfg, datasets, time.Now())) {
			return datasets, nil
		}
	}
}

// setArchiveReady records whether the last full read found the archive
// container in place and the plugin's, and with mountpoint none (see
// knownRelease).
func (m *Manager) setArchiveReady(ok, unmounted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.archiveReady, m.archiveUnmounted = ok, unmounted
}

// settled drops the names of datasets whose slot is under slot work (its
// lock held, or changed since vers): what Sync read of them may be half a
// change, such as a fresh slot created an instant before its properties.
func (m *Manager) settled(cfg Config, names []string, vers map[string]uint64) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, n := range names {
		if id := slotOf(cfg, n); id != "" && (m.busy[id] > 0 || m.vers[id] != vers[id]) {
			continue
		}
		out = append(out, n)
	}
	return out
}

// slotOf returns the device ID a dataset under the parent belongs to: one
// of a slot's own datasets, or one in the archive (its name starts with the
// device ID); "" for anything else.
func slotOf(cfg Config, name string) string {
	rel, ok := strings.CutPrefix(name, cfg.Parent+"/")
	if !ok {
		return ""
	}
	first, rest, ok := strings.Cut(rel, "/")
	switch {
	case !ok || strings.Contains(rest, "/"):
		return ""
	case first == record.ArchiveName:
		id, _, _ := strings.Cut(rest, ".")
		return id
	}
	if i, _ := record.SlotIndex(rest); i >= 0 {
		return record.DeviceID(first, i)
	}
	return ""
}

// prepareFreeUnlocked does prepareFree's chores on the free slots (and
// spares) that were not skipped, one slot at a time, each under its own
// lock, taken only when it is free now and the slot did not change since
// vers: a Reserve on one slot never waits for another slot's chores. The
// mount table is read once, before any lock is taken; a slot the plugin
// changed after that has a new version, and is skipped.
//
// A slot whose chores failed (now unhealthy, or without its spare) keeps
// its lock until this returns, just before Sync installs what it found: a
// Reserve meanwhile must not take the healthy view that Sync is about to
// replace.
func (m *Manager) prepareFreeUnlocked(cfg Config, slots []Slot, skipped map[string]bool, mine string, vers map[string]uint64) []error {
	c := freeChores{cfg: cfg}
	var errs []error
	var held []func()
	defer func() {
		for _, unlock := range held {
			unlock()
		}
	}()
	for i := range slots {
		s := &slots[i]
		if (s.State != record.StateFree || !s.ok) && s.Spare == "" || skipped[s.ID] {
			continue
		}
		c.readTable()
		unlock, ok := m.tryLockSlot(s.ID, mine)
		if !ok {
			skipped[s.ID] = true
			continue
		}
		if m.version(s.ID) != vers[s.ID] {
			// Changed since Sync read it (reserved, handed over): what
			// was read is not what is there.
			unlock()
			skipped[s.ID] = true
			continue
		}
		if failed := c.prepare(s); len(failed) > 0 {
			errs = append(errs, failed...)
			held = append(held, unlock)
			continue
		}
		unlock()
	}
	return errs
}

// splitActions sorts a plan's actions into the tree-wide ones (class and
// archive containers) and those of each slot, by device ID. The steps left
// for a dataset in the archive belong to the slot it came from (its name
// starts with the device ID).
func splitActions(cfg Config, actions []Action) (tree []Action, bySlot map[string][]Action) {
	bySlot = map[string][]Action{}
	for _, a := range actions {
		id := ""
		switch {
		case a.Kind == CreateClass || a.Kind == CreateArchive:
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

// applyAll runs the actions in order and returns those that succeeded. A
// failed action records why in failed (by slot dataset) and skips the rest
// of its chain.
func (m *Manager) applyAll(ctx context.Context, cfg Config, actions []Action, failed map[string]string) (done []Action, errs []error) {
	broken := map[string]bool{}
	for _, a := range actions {
		if a.Chain != "" && broken[a.Chain] {
			continue
		}
		if err := m.apply(ctx, cfg, a); err != nil {
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
			m.log.Error("slot change failed", "action", a.Kind.String(), "dataset", a.Dataset, "error", err)
			failed[a.Dataset] = reason
			errs = append(errs, fmt.Errorf("%s %s: %w", a.Kind, a.Dataset, err))
			if a.Kind == CreateClass {
				for i := 0; i < classByName(cfg, a.Class).Slots; i++ {
					failed[cfg.SlotDataset(a.Class, i)] = fmt.Sprintf("%s %s failed: %v", a.Kind, a.Dataset, err)
				}
			}
			continue
		}
		m.log.Info("slot changed", "action", a.Kind.String(), "dataset", a.Dataset, "prop", a.Prop, "value", a.Value, "target", a.Target)
		done = append(done, a)
	}
	return done, errs
}

// dropFailed removes actions on datasets that already failed in this Sync,
// so that a dataset that cannot be changed is not retried within one Sync.
func dropFailed(actions []Action, failed map[string]string) []Action {
	out := actions[:0]
	for _, a := range actions {
		if _, bad := failed[a.Dataset]; !bad {
			out = append(out, a)
		}
	}
	return out
}

func (m *Manager) apply(ctx context.Context, cfg Config, a Action) error {
	switch a.Kind {
	case CreateSlot:
		c := classByName(cfg, a.Class)
		switch {
		case c.Source != "":
			return m.zfs.Clone(ctx, c.Source, a.Dataset, a.Props)
		case c.Encrypted:
			return m.createEncrypted(ctx, cfg, a)
		}
		return m.zfs.Create(ctx, a.Dataset, a.Props)
	case CreateClass, CreateArchive:
		return m.zfs.Create(ctx, a.Dataset, a.Props)
	case DestroySlot:
		if a.CheckSource != "" {
			if _, err := m.zfs.GetExact(ctx, a.CheckSource, "guid"); err != nil {
				return fmt.Errorf("not made again (%s): source %s cannot be read, so the free dataset is kept: %w", a.Why, a.CheckSource, err)
			}
		}
		if err := m.zfs.Destroy(ctx, a.Dataset); err != nil {
			return err
		}
		return m.removeKey(cfg, a)
	case SetQuota:
		return m.zfs.Set(ctx, a.Dataset, "refquota", a.Value)
	case SetProp:
		return m.zfs.Set(ctx, a.Dataset, a.Prop, a.Value)
	case MountSlot:
		if classByName(cfg, a.Class).Encrypted {
			return m.zfs.MountLoadKey(ctx, a.Dataset)
		}
		return m.zfs.Mount(ctx, a.Dataset)
	case Unmount:
		err := m.zfs.Unmount(ctx, a.Dataset)
		if err != nil {
			// The plan sets canmount=noauto after the unmount (plan.go,
			// releaseSteps). While the unmount waits (a process still has
			// the dataset open), set it now, so that a reboot meanwhile
			// does not mount the released data again by itself.
			if serr := m.zfs.Set(context.WithoutCancel(ctx), a.Dataset, "canmount", "noauto"); serr != nil {
				m.log.Warn("released dataset's unmount failed, and so did canmount=noauto", "dataset", a.Dataset, "error", serr)
			}
		}
		return err
	case RenameToArchive:
		err := m.zfs.Rename(ctx, a.Dataset, a.Target)
		if errors.Is(err, zfs.ErrNoSpace) {
			return fmt.Errorf("%w (no room in %s, under its quota or in the pool: the data stays in its slot; with archive_quota, retention prunes the oldest archives to make room)", err, cfg.ArchiveDataset())
		}
		return err
	case DestroyArchived:
		// -r only ever inside the plugin's own archive tree.
		if err := m.zfs.DestroyRecursive(ctx, a.Dataset, cfg.ArchiveDataset()); err != nil {
			return err
		}
		return m.removeKey(cfg, a)
	}
	return fmt.Errorf("unknown action %d", a.Kind)
}

// reportUnreadable logs each dataset whose properties could not be parsed,
// once per manager: it is left alone, and only its own slot is unhealthy.
func (m *Manager) reportUnreadable(ds []zfs.Dataset) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range ds {
		if !m.reported[d.Name] {
			m.reported[d.Name] = true
			m.log.Error("dataset's properties cannot be read; leaving it alone", "dataset", d.Name, "error", d.Err)
		}
	}
}

// poolCheckAge is how long a release trusts the last check that found the
// pool ONLINE. A pool that fails meanwhile fails the release's commands,
// which keep the data and mark the slot unhealthy; the next Sync names why.
const poolCheckAge = 5 * time.Second

// checkPoolRecent is checkPool, skipped when a check found the pool ONLINE
// less than poolCheckAge ago.
func (m *Manager) checkPoolRecent(ctx context.Context, cfg Config) (string, error) {
	m.mu.Lock()
	recent := !m.poolOKAt.IsZero() && time.Since(m.poolOKAt) < poolCheckAge
	m.mu.Unlock()
	if recent {
		return "", nil
	}
	return m.checkPool(ctx, cfg)
}

// checkPool returns why the pool cannot be used, or "" when it is ONLINE.
// A check cut short by ctx says nothing of the pool: it returns ctx's
// error instead, and no slot is to be marked for it.
func (m *Manager) checkPool(ctx context.Context, cfg Config) (string, error) {
	reason := m.poolReason(ctx, cfg)
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("checking the pool: %w", err)
	}
	m.mu.Lock()
	m.poolOKAt = time.Time{}
	if reason == "" {
		m.poolOKAt = time.Now()
	}
	m.mu.Unlock()
	return reason, nil
}

func (m *Manager) poolReason(ctx context.Context, cfg Config) string {
	pool := cfg.Pool()
	health, err := m.zfs.PoolHealth(ctx, pool)
	switch {
	case errors.Is(err, zfs.ErrNotExist):
		return fmt.Sprintf("pool %s is not imported", pool)
	case err != nil:
		return fmt.Sprintf("pool %s cannot be read: %v", pool, err)
	case health != "ONLINE":
		return fmt.Sprintf("pool %s is %s", pool, health)
	}
	return ""
}

func parentReason(parent string, err error) string {
	if errors.Is(err, zfs.ErrNotExist) {
		return fmt.Sprintf("parent dataset %s does not exist", parent)
	}
	return fmt.Sprintf("parent dataset %s cannot be read: %v", parent, err)
}

// setUnavailable marks every slot unhealthy with reason, keeping what was
// last known of them (mountpoints, states) so that nothing is forgotten.
func (m *Manager) setUnavailable(cfg Config, reason string) {
	m.log.Warn("slots unavailable", "reason", reason)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.slots) == 0 {
		m.setSlotsLocked(buildSlots(cfg, nil, reason, nil))
		return
	}
	slots := append([]Slot(nil), m.slots...)
	for i := range slots {
		slots[i].setHealth(false, reason)
	}
	m.setSlotsLocked(slots)
}
