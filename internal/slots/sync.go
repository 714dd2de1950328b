package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/apply"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/repair"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
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

	reason, err := m.pool.Check(ctx, cfg)
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
	datasets, err := m.converge(ctx, cfg, read, func(plan reconcile.Plan) bool {
		m.setArchiveReady(plan.ArchiveReady, plan.ArchiveUnmounted)
		m.reportForeign(m.settled(cfg, plan.Foreign, vers))
		m.reportUnreadable(plan.Unreadable)
		tree, bySlot := apply.Split(cfg, apply.DropFailed(plan.Actions, failed))
		for id := range bySlot {
			if skipped[id] {
				delete(bySlot, id)
			}
		}
		if len(tree) == 0 && len(bySlot) == 0 {
			return false
		}
		// applied: some change was made, which a read after it checks.
		// When every slot with a change was left to its slot work (under
		// a churn, slots being released), the tree is read again only at
		// the next sync: a read now would show the same.
		applied := false
		if len(tree) > 0 {
			if m.treeMu.TryLock() {
				_, errs2 := m.apply.All(ctx, cfg, tree, failed)
				m.treeMu.Unlock()
				errs = append(errs, errs2...)
				applied = true
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
			_, errs2 := m.apply.All(ctx, cfg, bySlot[id], failed)
			unlock()
			errs = append(errs, errs2...)
			applied = true
		}
		return applied
	})
	if err != nil {
		m.setUnavailable(cfg, view.ParentReason(cfg.Parent, err))
		return errors.Join(errs...)
	}

	slots := view.Build(cfg, datasets, "", failed)
	errs = append(errs, m.prepareFreeUnlocked(cfg, slots, skipped, mine, vers)...)
	m.mu.Lock()
	for i, s := range slots {
		if skipped[s.ID] || m.busy[s.ID] > 0 || m.proofs.Under(s.ID) || m.vers[s.ID] != vers[s.ID] {
			if j, ok := m.byID[s.ID]; ok {
				slots[i] = m.slots[j]
			}
		}
	}
	m.ten.KeepDue(slots)
	m.setSlotsLocked(slots)
	m.usageAt = time.Now()
	m.parentRoom = view.ParentRoomOf(cfg.Parent, datasets)
	m.mu.Unlock()
	return errors.Join(errs...)
}

// converge runs rounds of observe → plan → apply, the loop of both Sync and
// a slot's release: read observes ZFS (repairing what did not parse), the
// plan is made from what it said, and act applies the part of the plan
// that is the caller's, returning false when it applied nothing (nothing
// to do, or all of it left to other work): a read after it would show the
// same. It stops there, or after maxRounds rounds, and returns the last
// read.
func (m *Manager) converge(ctx context.Context, cfg Config, read func(context.Context) ([]zfs.Dataset, error), act func(reconcile.Plan) bool) ([]zfs.Dataset, error) {
	for round := 0; ; round++ {
		datasets, err := read(ctx)
		if err != nil {
			return nil, err
		}
		if repair.Unreadable(datasets) {
			// The exact reads are raw: what an armed state means is said
			// here, with every dataset of the read beside them (a spare's
			// sibling). The others are said already, and left as they are.
			datasets = m.arm.Normalize(repair.Datasets(ctx, m.zfs, m.log, datasets), time.Time{}, "", 0, false)
		}
		if round == maxRounds || !act(reconcile.MakePlan(cfg, datasets, time.Now())) {
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
		if id := cfg.SlotOf(n); id != "" && (m.busy[id] > 0 || m.proofs.Under(id) || m.vers[id] != vers[id]) {
			continue
		}
		out = append(out, n)
	}
	return out
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
	c := mounts.Chores{Cfg: cfg}
	var errs []error
	var held []func()
	defer func() {
		for _, unlock := range held {
			unlock()
		}
	}()
	for i := range slots {
		s := &slots[i]
		if (s.State != record.StateFree || !s.OK) && s.Spare == "" || skipped[s.ID] {
			continue
		}
		c.ReadTable()
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
		if failed := c.Prepare(s); len(failed) > 0 {
			errs = append(errs, failed...)
			held = append(held, unlock)
			continue
		}
		unlock()
	}
	return errs
}
