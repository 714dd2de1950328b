package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// This file holds the work on one slot's datasets under its lock: the
// release of one of them, and the making of the slot's fresh dataset or
// spare. Both are the loop Sync runs (converge), on the slot's own
// datasets read by name.

// knownRelease returns the first steps of the release of rs, a dataset of
// slot cur whose release this run has just begun, decided from what the
// plugin knows rather than from a read (see releasingDataset): down to the
// rename into the archive, then a fresh dataset under its name when the
// slot has no other (the asker's, when asker is known). It returns nil
// when the plugin is not sure enough: the archive container was not
// confirmed by the last full read, the class is no longer configured, the
// slot's other name holds something other than a spare or the dataset in
// use, or the host's mount table does not say plainly whether rs is
// mounted at its mountpoint, or shows it mounted somewhere else too.
func (m *Manager) knownRelease(cur, rs Slot, asker record.Owner) []Action {
	m.mu.Lock()
	ready, unmounted, cfg := m.archiveReady, m.archiveUnmounted, m.cfg
	m.mu.Unlock()
	c := classByName(cfg, rs.Class)
	if !ready || c.Name != rs.Class || rs.Mountpoint == "" {
		return nil
	}
	var again bool
	switch {
	case cur.Dataset == rs.Dataset && cur.sib == nameAbsent:
		again = true
	case cur.Dataset == rs.Dataset && cur.sib == nameFresh:
	case cur.old != nil && cur.old.Dataset == rs.Dataset && cur.State == record.StateReserved:
		again = true // the slot's next spare
	case cur.old != nil && cur.old.Dataset == rs.Dataset && cur.State == record.StateFree:
	default:
		return nil
	}
	table, err := hostfs.ReadTable()
	if err != nil {
		return nil
	}
	mounted := false
	if mnt, ok := table.At(rs.Mountpoint); ok {
		if mnt.Source != rs.Dataset {
			return nil
		}
		mounted = true
	}
	for _, mnt := range table.Of(rs.Dataset) {
		if mnt.MountPoint != rs.Mountpoint {
			// Mounted where the plugin did not put it: a mountpoint set
			// by hand since the last read, which a rename would keep and
			// mount again. A read decides the steps (unmounted first).
			return nil
		}
	}
	actions := releaseSteps(cfg, c, rs.Index, releasingDataset(rs, mounted), time.Now(), again, unmounted)
	if asker.Known() {
		for i, a := range actions {
			if a.Kind == CreateSlot && a.Dataset == rs.Dataset {
				// Made for the asker: reserved, its owner recorded, in
				// the one command that creates it.
				props := maps.Clone(a.Props)
				props[record.PropState], props[record.PropOwner] = string(record.To(record.Reserve)), asker.Encode()
				actions[i].Props = props
			}
		}
	}
	return actions
}

// releasingDataset is slot dataset s (being released) as ZFS has it once
// its release has begun: its fate as its state, its owner, mounted or not,
// its mountpoint when it is its own, and canmount not yet changed. The
// release's first steps are decided from it without reading ZFS again; a
// step that finds ZFS otherwise fails, and the next attempt reads.
func releasingDataset(s Slot, mounted bool) zfs.Dataset {
	local := func(v string) zfs.Prop { return zfs.Prop{Value: v, Source: "local"} }
	yes := "no"
	if mounted {
		yes = "yes"
	}
	props := map[string]zfs.Prop{
		record.PropManaged: local(record.ManagedSlot),
		record.PropState:   local(string(record.FateOf(s.State))),
		"mounted":          {Value: yes, Source: "-"},
		"canmount":         {Value: "on", Source: "default"},
	}
	if s.Owner.Known() {
		props[record.PropOwner] = local(s.Owner.Encode())
	}
	if s.ownMount {
		props["mountpoint"] = local(s.Mountpoint)
	}
	return zfs.Dataset{Name: s.Dataset, Props: props}
}

// setProps writes props on a dataset; the state goes last, so that a
// crash in between leaves the slot in its old state with the new facts.
func (m *Manager) setProps(ctx context.Context, name string, props map[string]string) error {
	state, hasState := props[record.PropState]
	rest := maps.Clone(props)
	delete(rest, record.PropState)
	if len(rest) > 0 {
		if err := m.zfs.SetMany(ctx, name, rest); err != nil {
			return err
		}
	}
	if hasState {
		return m.zfs.Set(ctx, name, record.PropState, state)
	}
	return nil
}

// datasetNames returns the names of the slot's datasets that exist, as
// last observed.
func (s Slot) datasetNames(cfg Config) []string {
	var out []string
	names := cfg.SlotNames(s.Class, s.Index)
	for _, n := range names {
		switch {
		case n == s.Dataset && (s.present || s.unreadable):
		case n != s.Dataset && s.sib != nameAbsent:
		default:
			continue
		}
		out = append(out, n)
	}
	return out
}

// tend is one piece of work on a slot's datasets (tendSlotLocked).
type tend struct {
	// focus is the dataset whose release is carried out; "" for none.
	focus string
	// first are steps decided without a read (knownRelease), applied
	// before anything is read.
	first []Action
	// asker, when known, is the allocation that waits for the work:
	// only the release of focus is carried out then, so that it waits
	// for nothing else.
	asker record.Owner
	// outside: focus is the slot's old dataset, and first's steps up to
	// its rename run without the slot's lock, so that work on the
	// dataset that serves (a Reserve) does not wait for them. Nothing
	// else touches the old dataset meanwhile: the run is registered
	// (m.runs), which keeps other runs and Sync off the slot, and
	// handOverSpare waits for a slot without one. A fresh dataset
	// decided from what served then is made only if that is unchanged.
	outside bool
	// run is the run carrying the work, whose steps outside the slot's
	// lock yield to tasks' starts (yieldToStarts); nil: they do not.
	run *releaseRun
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
	reason, err := m.checkPoolRecent(ctx, cfg)
	if err != nil {
		unlock()
		return fmt.Errorf("slot %s: %w; its data is kept", cur.ID, err)
	}
	if reason != "" {
		unlock()
		m.setUnavailable(cfg, reason)
		return fmt.Errorf("slot %s: %s; its data is kept", cur.ID, reason)
	}
	if cur, err = m.fateBehindLocked(ctx, cur, unlock); err != nil {
		return err
	}
	var (
		errs   []error
		failed = make(map[string]string)
		chains = map[string]bool{t.focus: true}
		done   []Action
	)
	first := t.first
	if t.outside && len(first) > 0 {
		var pre []Action // the create, if any, is decided again below
		for _, a := range first {
			if a.Kind != CreateSlot {
				pre = append(pre, a)
			}
		}
		unlock()
		if t.run != nil {
			m.yieldToStarts(ctx, cur.ID, t.run, "releasing the old dataset")
		}
		done, errs = m.applyAll(ctx, cfg, pre, failed)
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
	for _, n := range cur.datasetNames(cfg) {
		names[n] = true
	}
	if t.focus != "" {
		names[t.focus] = true
	}
	follow(done, names, chains)
	if len(first) > 0 {
		done2, errs2 := m.applyAll(ctx, cfg, first, failed)
		errs = append(errs, errs2...)
		done = append(done, done2...)
		follow(done2, names, chains)
	}
	if len(errs) == 0 && m.settleKnown(cfg, cur, t, done) {
		unlock()
		return nil
	}
	mine := func(a Action) bool {
		if t.asker.Known() {
			return chains[a.Chain]
		}
		return a.Kind != CreateClass && a.Kind != CreateArchive && slotOf(cfg, a.Dataset) == cur.ID
	}
	read := func(ctx context.Context) ([]zfs.Dataset, error) {
		return m.zfs.GetNames(ctx, slices.Sorted(maps.Keys(names)), ObservedProps...)
	}
	datasets, err := m.converge(ctx, cfg, read, func(plan Plan) bool {
		var actions []Action
		for _, a := range plan.Actions {
			if mine(a) {
				actions = append(actions, a)
			}
		}
		actions = dropFailed(actions, failed)
		if len(actions) == 0 {
			return false
		}
		done, errs2 := m.applyAll(ctx, cfg, actions, failed)
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
			if _, still := releasingOf(s, t.focus); still {
				return fmt.Errorf("releasing %s: not finished (%s)", cur.ID, orDash(s.HealthDesc))
			}
		}
		return nil
	}
	var fresh []Slot
	for _, x := range buildSlots(cfg, datasets, "", failed) {
		if x.ID == cur.ID {
			fresh = append(fresh, x)
		}
	}
	// A dataset made for the asker is readied on the host as a free one
	// would be, before Reserve hands it over.
	made := make([]bool, len(fresh))
	for i, x := range fresh {
		if t.asker.Known() && x.State == record.StateReserved && x.stamped.AllocID == t.asker.AllocID {
			made[i], fresh[i].State = true, record.StateFree
		}
	}
	errs = append(errs, prepareFree(cfg, fresh)...)
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
	sortSlots(merged)
	m.vers[cur.ID]++
	m.forgetFatesLocked(merged)
	m.setSlotsLocked(merged)
	m.mu.Unlock()
	unlock()
	return errors.Join(errs...)
}

// follow updates what slot work reads next from what it did: the archived
// dataset under its new name, a dataset made, nothing that was destroyed.
func follow(done []Action, names, chains map[string]bool) {
	for _, a := range done {
		switch a.Kind {
		case RenameToArchive:
			delete(names, a.Dataset)
			names[a.Target], chains[a.Target] = true, true
		case CreateSlot:
			names[a.Dataset] = true
		case DestroyArchived, DestroySlot:
			delete(names, a.Dataset)
		}
	}
}

// remake returns the step that makes the name of focus, the slot's old
// dataset, again as its spare once it is renamed: when the dataset that
// serves is in use, its handover recorded (unrecordedSlot). Nothing
// otherwise.
func (m *Manager) remake(cfg Config, cur Slot, focus string) []Action {
	c := classByName(cfg, cur.Class)
	if cur.old == nil || cur.old.Dataset != focus || cur.State != record.StateReserved || cur.Surplus || c.Name != cur.Class || unrecordedSlot(cur) {
		return nil
	}
	return []Action{{Kind: CreateSlot, Dataset: focus, Class: cur.Class, Index: cur.Index, Props: c.SlotProps(), Chain: focus}}
}

// settleKnown installs the outcome of work decided without a read (done,
// all of which succeeded) when it needs no read either: the old dataset
// of the slot, bound for the archive, renamed there, and the spare made
// under its name (or none needed, the slot serving from a fresh dataset)
// and mounted where the dataset that serves says, as the host's mount
// table shows. It reports whether it did; otherwise the caller reads.
func (m *Manager) settleKnown(cfg Config, cur Slot, t tend, done []Action) bool {
	if t.asker.Known() || cur.Mountpoint == "" {
		return false
	}
	renamed, made := false, ""
	for _, a := range done {
		switch {
		case a.Kind == RenameToArchive && a.Dataset == t.focus:
			renamed = true
		case a.Kind == CreateSlot && a.Dataset != cur.Dataset:
			made = a.Dataset
		}
	}
	x := cur
	if t.focus != "" {
		if cur.old == nil || cur.old.Dataset != t.focus || cur.old.State != record.StateReleasing || !renamed {
			return false
		}
		x.old, x.sib = nil, nameAbsent
	}
	switch {
	case made != "":
		_, leaf, _ := cutLast(made)
		mp := filepath.Join(filepath.Dir(cur.Mountpoint), leaf)
		table, err := hostfs.ReadTable()
		if err != nil {
			return false
		}
		if mnt, ok := table.At(mp); !ok || mnt.Source != made {
			return false
		}
		x.Spare, x.spareMount, x.sib, x.spareArmed = made, mp, nameFresh, m.arm.tokenOf(made)
	case t.focus == "" || cur.State != record.StateFree && !unrecordedSlot(cur):
		// Nothing made, or a slot in use left without a spare (but one
		// whose handover is not recorded yet: none is made beside it on
		// purpose, remake): read.
		return false
	}
	ready := []Slot{x}
	if errs := prepareFree(cfg, ready); len(errs) > 0 {
		m.log.Warn("spare not readied; the slot's next release waits for one", "device", cur.ID, "error", errors.Join(errs...))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[cur.ID]
	if !ok {
		return false
	}
	// Onto the current view (the pool's health may have been marked
	// meanwhile): only what this work changed.
	slots := append([]Slot(nil), m.slots...)
	now := &slots[i]
	now.old, now.sib = nil, ready[0].sib
	now.Spare, now.spareMount, now.spareOwn, now.spareArmed = ready[0].Spare, ready[0].spareMount, ready[0].spareOwn, ready[0].spareArmed
	m.vers[cur.ID]++
	m.setSlotsLocked(slots)
	return true
}

// goTend makes, in a run of its own, the spare of slot id when it is in
// use and has none (the one `zfs create` that the next tenant's Reserve
// then does not wait for). It does nothing while another run works on the
// slot: that run, or the next Sync, sees to it.
func (m *Manager) goTend(ctx context.Context, id string) {
	s, ok := m.slot(id)
	if !ok || s.State != record.StateReserved || s.sib != nameAbsent || s.Surplus || unrecordedSlot(s) {
		return
	}
	r, created := m.newRun(id, false)
	if !created {
		return
	}
	m.carry(ctx, id, r, "making the spare", func(ctx context.Context) error {
		m.yieldToStarts(ctx, id, r, "making the spare")
		unlock, err := m.lockSlot(ctx, id, "make the spare")
		if err != nil {
			return fmt.Errorf("making the spare of %s: %w", id, err)
		}
		cur, ok := m.slot(id)
		if !ok || cur.State != record.StateReserved || cur.sib != nameAbsent || cur.Surplus || unrecordedSlot(cur) {
			unlock()
			return nil
		}
		m.mu.Lock()
		cfg := m.cfg
		m.mu.Unlock()
		c := classByName(cfg, cur.Class)
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
		first := []Action{{Kind: CreateSlot, Dataset: spare, Class: cur.Class, Index: cur.Index, Props: c.SlotProps()}}
		return m.tendSlotLocked(ctx, cur, tend{first: first}, unlock)
	})
}
