package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Run records owners and releases the slots of ended allocations whenever
// it is kicked (after Reserve, and by the caller on every new allocation
// list) and every period, until ctx is done.
func (m *Manager) Run(ctx context.Context, period time.Duration) {
	timer := time.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-timer.C:
			timer.Reset(period)
		}
		if err := m.ReleaseEnded(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("release pass incomplete", "error", err)
		}
	}
}

// ReleaseEnded records the owners identified at Reserve, then, from one
// read of the node's allocations that began now, starts the release of
// every reserved slot that may be released (decide), and carries out every
// started release. A slot that may not be released is kept, with why in
// its health: unhealthy when its owner is unknown or cannot be verified,
// or when something holds it that should not (conflict). No lock is held
// while the API is read.
func (m *Manager) ReleaseEnded(ctx context.Context) error {
	m.mu.Lock()
	nomad := m.nomad
	pending := maps.Clone(m.owners)
	m.mu.Unlock()
	if nomad == nil {
		return nil
	}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(pending)) {
		if err := m.recordOwner(ctx, id, pending[id]); err != nil {
			errs = append(errs, err)
		}
	}
	// Every device's health warns while the token may not see every
	// namespace, whether or not a slot is in use.
	m.setIncomplete(nomad.Incomplete(ctx))
	// Decisions are made from this copy; a release starts only while the
	// slot is still the version decided from (startRelease).
	slots := m.Slots()
	var reserved, releasing []Slot
	for _, s := range slots {
		switch {
		case s.unreadable:
		case s.State == StateReleasing || s.State == StateDestroying:
			releasing = append(releasing, s)
		case s.State == StateReserved:
			reserved = append(reserved, s)
		}
	}
	if len(reserved) > 0 {
		v, err := nomad.View(ctx, time.Now())
		if err != nil {
			for _, s := range reserved {
				text := fmt.Sprintf("owner unverified: the node's allocations cannot be read (%v); its data is kept", err)
				if !s.Owner.Known() {
					text = fmt.Sprintf("owner unknown: the allocation it was handed to was never identified, and the node's allocations cannot be read (%v); its data is kept", err)
				}
				m.setNote(s.ID, note{unhealthy: true, text: text})
			}
			m.log.Warn("cannot read the node's allocations; keeping every in-use dataset", "error", err)
		} else {
			m.setIncomplete(v.Incomplete)
			for _, s := range reserved {
				d := m.decide(ctx, nomad, v, s, false)
				switch d.kind {
				case inUse:
					m.setNote(s.ID, note{})
				case startRelease:
					m.log.Info("owner ended", "device", s.ID, "owner", s.Owner.String(), "reason", d.reason)
					if err := m.startRelease(ctx, s); err != nil {
						errs = append(errs, err)
						continue
					}
					releasing = append(releasing, s)
				default:
					m.setNote(s.ID, note{unhealthy: true, text: d.reason})
				}
			}
		}
	}
	for _, s := range releasing {
		if err := m.releaseSlot(ctx, s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recordOwner writes an owner identified at Reserve on the slot's dataset
// (one zfs command), unless the slot changed since.
func (m *Manager) recordOwner(ctx context.Context, id string, o Owner) error {
	unlock, err := m.lockSlot(ctx, id)
	if err != nil {
		return fmt.Errorf("recording the owner of %s: %w", id, err)
	}
	defer unlock()
	s, ok := m.slot(id)
	m.mu.Lock()
	cur, pending := m.owners[id]
	m.mu.Unlock()
	if !pending || cur != o {
		// Released and reserved again since o was identified: o belongs to
		// an earlier dataset of this slot.
		return nil
	}
	if !ok || s.State != StateReserved || s.stamped.Known() {
		m.mu.Lock()
		delete(m.owners, id)
		m.mu.Unlock()
		return nil
	}
	if err := m.zfs.Set(ctx, s.Dataset, PropOwner, o.Encode()); err != nil {
		return fmt.Errorf("recording the owner of %s: %w", id, err)
	}
	m.mu.Lock()
	delete(m.owners, id)
	m.mu.Unlock()
	m.updateSlot(id, func(x *Slot) { x.Owner, x.stamped = o, o })
	m.log.Debug("owner recorded", "device", id, "owner", o.String())
	return nil
}

// startRelease records, under the slot's lock, that the release of s has
// begun: the owner (when not recorded yet), the release time and the state
// that the release carries out (releasing, or destroying when the class
// says so). It does nothing when the slot changed since s was read. When
// ZFS refuses (a full pool), the slot is kept, unhealthy with why.
func (m *Manager) startRelease(ctx context.Context, s Slot) error {
	unlock, err := m.lockSlot(ctx, s.ID)
	if err != nil {
		return fmt.Errorf("starting the release of %s: %w", s.ID, err)
	}
	defer unlock()
	cur, ok := m.slot(s.ID)
	if !ok || cur.ver != s.ver || cur.State != StateReserved || cur.Owner.AllocID != s.Owner.AllocID {
		// Changed since the decision (reserved again, owner recorded,
		// released): decide again from a new read.
		return nil
	}
	m.mu.Lock()
	c := classByName(m.cfg, s.Class)
	m.mu.Unlock()
	state := StateReleasing
	if c.OnRelease == OnReleaseDestroy {
		state = StateDestroying
	}
	props := map[string]string{
		PropReleasedAt: time.Now().UTC().Format(time.RFC3339),
		PropState:      string(state),
	}
	if s.Owner.Known() && !cur.stamped.Known() {
		props[PropOwner] = s.Owner.Encode()
	}
	if err := m.setProps(ctx, s.Dataset, props); err != nil {
		m.setNote(s.ID, note{unhealthy: true, text: fmt.Sprintf("release blocked: %v; its data is kept", err)})
		return fmt.Errorf("starting the release of %s: %w", s.ID, err)
	}
	m.mu.Lock()
	delete(m.owners, s.ID)
	delete(m.notes, s.ID)
	m.mu.Unlock()
	m.updateSlot(s.ID, func(x *Slot) {
		x.State, x.Owner = state, s.Owner
		x.setHealth(false, releasingReason(*x))
		x.inRelease = true
	})
	m.log.Info("release started", "device", s.ID, "dataset", s.Dataset, "owner", s.Owner.String(), "on_release", c.OnRelease)
	return nil
}

// setProps writes props on a dataset; the state goes last, so that a
// crash in between leaves the slot in its old state with the new facts.
func (m *Manager) setProps(ctx context.Context, name string, props map[string]string) error {
	state, hasState := props[PropState]
	rest := maps.Clone(props)
	delete(rest, PropState)
	if len(rest) > 0 {
		if err := m.zfs.SetMany(ctx, name, rest); err != nil {
			return err
		}
	}
	if hasState {
		return m.zfs.Set(ctx, name, PropState, state)
	}
	return nil
}

// releaseSlot carries out the started release of one slot, under its lock.
// It reads only what the release touches (the parent, the slot's dataset,
// its class container, the archive container and, once renamed, the
// archived dataset), by name and without recursion, so one release costs
// the same few zfs commands whether the node has ten slots or a thousand.
// Each step is decided from what ZFS has just said, exactly as Sync would.
// When anything it reads is missing, or reading fails, it leaves the slot
// to a full Sync, which decides from the whole tree. On return the slot
// reflects what ZFS said.
func (m *Manager) releaseSlot(ctx context.Context, s Slot) error {
	unlock, err := m.lockSlot(ctx, s.ID)
	if err != nil {
		return fmt.Errorf("releasing %s: %w", s.ID, err)
	}
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()
	if reason := m.checkPool(ctx, cfg); reason != "" {
		unlock()
		m.setUnavailable(cfg, reason)
		return nil
	}
	names := map[string]bool{cfg.Parent: true, cfg.ArchiveDataset(): true, s.Dataset: true, cfg.ClassDataset(s.Class): true}
	chains := map[string]bool{s.Dataset: true}
	var (
		datasets []zfs.Dataset
		errs     []error
		failed   = make(map[string]string)
	)
	for round := 0; ; round++ {
		var err error
		datasets, err = m.zfs.GetNames(ctx, slices.Sorted(maps.Keys(names)), ObservedProps...)
		if err != nil {
			unlock()
			level := hclog.Warn
			if errors.Is(err, zfs.ErrNotExist) {
				level = hclog.Debug // a dataset the release expected is not there: the full sync sorts it out
			}
			m.log.Log(level, "release: targeted read failed; falling back to a full sync", "device", s.ID, "error", err)
			return errors.Join(append(errs, m.Sync(ctx))...)
		}
		if hasUnreadable(datasets) {
			datasets = m.repair(ctx, datasets)
		}
		if round == maxRounds {
			break
		}
		var actions []Action
		for _, a := range MakePlan(cfg, datasets, time.Now()).Actions {
			if chains[a.Chain] {
				actions = append(actions, a)
			}
		}
		actions = dropFailed(actions, failed)
		if len(actions) == 0 {
			break
		}
		done, errs2 := m.applyAll(ctx, cfg, actions, failed)
		errs = append(errs, errs2...)
		// What the next round reads follows what was done: the archived
		// dataset under its new name, the fresh slot (none for a slot
		// beyond the configured count), nothing that was destroyed.
		for _, a := range done {
			switch a.Kind {
			case RenameToArchive:
				delete(names, a.Dataset)
				names[a.Target], chains[a.Target] = true, true
			case CreateSlot:
				names[a.Dataset] = true
			case DestroyArchived:
				delete(names, a.Dataset)
			}
		}
	}
	var fresh []Slot
	for _, x := range buildSlots(cfg, datasets, "", failed) {
		if x.ID == s.ID {
			fresh = append(fresh, x)
		}
	}
	errs = append(errs, prepareFree(cfg, fresh)...)
	m.mu.Lock()
	merged := fresh
	for _, x := range m.slots {
		if x.ID != s.ID {
			merged = append(merged, x)
		}
	}
	sortSlots(merged)
	m.vers[s.ID]++
	m.setSlotsLocked(merged)
	m.mu.Unlock()
	unlock()
	return errors.Join(errs...)
}
