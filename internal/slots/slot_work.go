package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/apply"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// This file holds the work on one slot's datasets under its lock: the
// release of one of them, and the making of the slot's fresh dataset or
// spare. Both are the loop Sync runs (converge), on the slot's own
// datasets read by name.

// tend is one piece of work on a slot's datasets (tendSlotLocked).
type tend struct {
	// focus is the dataset whose release is carried out; "" for none.
	focus string
	// first are steps decided without a read (knownRelease), applied
	// before anything is read.
	first []reconcile.Action
	// asker, when known, is the allocation that waits for the work:
	// only the release of focus is carried out then, so that it waits
	// for nothing else.
	asker record.Owner
	// outside: focus is the slot's old dataset, and first's steps up to
	// its rename run without the slot's lock, so that work on the
	// dataset that serves (a Reserve) does not wait for them. Nothing
	// else touches the old dataset meanwhile: the run is registered
	// (m.runs), which keeps other runs and Sync off the slot, and
	// spare.Hander.HandOver waits for a slot without one. A fresh dataset
	// decided from what served then is made only if that is unchanged.
	outside bool
	// run is the run carrying the work, whose steps outside the slot's
	// lock yield to tasks' starts (yieldToStarts); nil: they do not.
	run *release.Run
}

// tendSlotLocked brings slot cur's datasets to what the plan says, under
// the slot's lock (held by the caller, and given up through unlock before
// it returns): first the steps decided without a read (t.first), then
// rounds of reading the slot's datasets by name and applying the slot's
// part of the plan (converge). Without an asker everything the slot needs
// is done, its fresh dataset or spare included. It reads the parent, the
// class and archive containers and the slot's own datasets, by name and
// without recursion, so its cost is the same whether the node has ten
// slots or a thousand. When anything it reads is missing, or reading
// fails, it leaves the slot to a full Sync, which decides from the whole
// tree. On return the slot reflects what ZFS said; the error is nil only
// when nothing is left to do for t.focus.
func (m *Manager) tendSlotLocked(ctx context.Context, cur Slot, t tend, unlock func()) error {
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()
	reason, err := m.pool.Recent(ctx, cfg)
	if err != nil {
		unlock()
		return fmt.Errorf("slot %s: %w; its data is kept", cur.ID, err)
	}
	if reason != "" {
		unlock()
		m.setUnavailable(cfg, reason)
		return fmt.Errorf("slot %s: %s; its data is kept", cur.ID, reason)
	}
	if cur, err = m.fates.BehindLocked(ctx, cur, unlock); err != nil {
		return err
	}
	var (
		errs   []error
		failed = make(map[string]string)
		chains = map[string]bool{t.focus: true}
		done   []reconcile.Action
	)
	first := t.first
	if t.outside && len(first) > 0 {
		var pre []reconcile.Action // the create, if any, is decided again below
		for _, a := range first {
			if a.Kind != reconcile.CreateSlot {
				pre = append(pre, a)
			}
		}
		unlock()
		if t.run != nil {
			m.yieldToStarts(ctx, cur.ID, t.run, "releasing the old dataset")
		}
		done, errs = m.apply.All(ctx, cfg, pre, failed)
		if t.run != nil {
			m.yieldToStarts(ctx, cur.ID, t.run, "taking the slot's lock again")
		}
		var lerr error
		if unlock, lerr = m.lockSlot(ctx, cur.ID, "release"); lerr != nil {
			return errors.Join(append(errs, fmt.Errorf("slot %s: %w", cur.ID, lerr))...)
		}
		now, ok := m.slot(cur.ID)
		if !ok {
			unlock()
			return errors.Join(errs...)
		}
		first = nil
		if len(errs) == 0 {
			// Made again only as what serves now asks for (the spare of
			// a slot in use), which may have changed meanwhile.
			first = m.remake(cfg, now, t.focus)
		}
		cur = now
	}
	names := map[string]bool{cfg.Parent: true, cfg.ArchiveDataset(): true, cfg.ClassDataset(cur.Class): true}
	for _, n := range cur.DatasetNames(cfg) {
		names[n] = true
	}
	if t.focus != "" {
		names[t.focus] = true
	}
	follow(done, names, chains)
	if len(first) > 0 {
		done2, errs2 := m.apply.All(ctx, cfg, first, failed)
		errs = append(errs, errs2...)
		done = append(done, done2...)
		follow(done2, names, chains)
	}
	if len(errs) == 0 && m.settleKnown(cfg, cur, t, done) {
		unlock()
		return nil
	}
	mine := func(a reconcile.Action) bool {
		if t.asker.Known() {
			return chains[a.Chain]
		}
		return a.Kind != reconcile.CreateClass && a.Kind != reconcile.CreateArchive && cfg.SlotOf(a.Dataset) == cur.ID
	}
	read := func(ctx context.Context) ([]zfs.Dataset, error) {
		return m.zfs.GetNames(ctx, slices.Sorted(maps.Keys(names)), ObservedProps...)
	}
	datasets, err := m.converge(ctx, cfg, read, func(plan reconcile.Plan) bool {
		var actions []reconcile.Action
		for _, a := range plan.Actions {
			if mine(a) {
				actions = append(actions, a)
			}
		}
		actions = apply.DropFailed(actions, failed)
		if len(actions) == 0 {
			return false
		}
		done, errs2 := m.apply.All(ctx, cfg, actions, failed)
		errs = append(errs, errs2...)
		follow(done, names, chains)
		return true
	})
	if err != nil {
		unlock()
		level := hclog.Warn
		if errors.Is(err, zfs.ErrNotExist) {
			level = hclog.Debug // a dataset the slot's work expected is not there: the full sync sorts it out
		}
		m.log.Log(level, "slot work: targeted read failed; falling back to a full sync", "device", cur.ID, "error", err)
		// The full sync decides again from the whole tree, steps that
		// failed here included: its outcome is the slot work's.
		if err := m.sync(ctx, cur.ID); err != nil {
			return err
		}
		if s, ok := m.slot(cur.ID); ok && t.focus != "" {
			if _, still := release.Of(s, t.focus); still {
				return fmt.Errorf("releasing %s: not finished (%s)", cur.ID, view.OrDash(s.HealthDesc))
			}
		}
		return nil
	}
	var fresh []Slot
	for _, x := range view.Build(cfg, datasets, "", failed) {
		if x.ID == cur.ID {
			fresh = append(fresh, x)
		}
	}
	// A dataset made for the asker is readied on the host as a free one
	// would be, before Reserve hands it over.
	made := make([]bool, len(fresh))
	for i, x := range fresh {
		if t.asker.Known() && x.State == record.StateReserved && x.Stamped.AllocID == t.asker.AllocID {
			made[i], fresh[i].State = true, record.StateFree
		}
	}
	errs = append(errs, mounts.PrepareFree(cfg, fresh)...)
	for i := range fresh {
		if made[i] {
			fresh[i].State = record.StateReserved
		}
	}
	m.mu.Lock()
	merged := fresh
	for _, x := range m.slots {
		if x.ID != cur.ID {
			merged = append(merged, x)
		}
	}
	view.SortSlots(merged)
	m.vers[cur.ID]++
	m.ten.KeepDue(merged)
	m.setSlotsLocked(merged)
	m.mu.Unlock()
	unlock()
	return errors.Join(errs...)
}

// follow updates what slot work reads next from what it did: the archived
// dataset under its new name, a dataset made, nothing that was destroyed.
func follow(done []reconcile.Action, names, chains map[string]bool) {
	for _, a := range done {
		switch a.Kind {
		case reconcile.RenameToArchive:
			delete(names, a.Dataset)
			names[a.Target], chains[a.Target] = true, true
		case reconcile.CreateSlot:
			names[a.Dataset] = true
		case reconcile.DestroyArchived, reconcile.DestroySlot:
			delete(names, a.Dataset)
		}
	}
}

// goTend makes, in a run of its own, the spare of slot id when it is in
// use and has none (the one `zfs create` that the next tenant's Reserve
// then does not wait for). It does nothing while another run works on the
// slot: that run, or the next Sync, sees to it.
func (m *Manager) goTend(ctx context.Context, id string) {
	s, ok := m.slot(id)
	if !ok || s.State != record.StateReserved || s.Sib != reconcile.NameAbsent || s.Surplus || unrecordedSlot(s) {
		return
	}
	r, created := m.runs.New(id, false)
	if !created {
		return
	}
	m.runs.Carry(ctx, id, r, "making the spare", func(ctx context.Context) error {
		m.yieldToStarts(ctx, id, r, "making the spare")
		unlock, err := m.lockSlot(ctx, id, "make the spare")
		if err != nil {
			return fmt.Errorf("making the spare of %s: %w", id, err)
		}
		cur, ok := m.slot(id)
		if !ok || cur.State != record.StateReserved || cur.Sib != reconcile.NameAbsent || cur.Surplus || unrecordedSlot(cur) {
			unlock()
			return nil
		}
		m.mu.Lock()
		cfg := m.cfg
		m.mu.Unlock()
		c := reconcile.ClassByName(cfg, cur.Class)
		if c.Name != cur.Class {
			unlock()
			return nil
		}
		var spare string
		for _, n := range cfg.SlotNames(cur.Class, cur.Index) {
			if n != cur.Dataset {
				spare = n
			}
		}
		first := []reconcile.Action{{Kind: reconcile.CreateSlot, Dataset: spare, Class: cur.Class, Index: cur.Index, Props: c.SlotProps()}}
		return m.tendSlotLocked(ctx, cur, tend{first: first}, unlock)
	})
}
