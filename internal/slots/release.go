package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Run records owners and starts the release of the slots of ended
// allocations whenever it is kicked (after Reserve, and by the caller on
// every new allocation list) and every period, until ctx is done. It never
// waits for a release: each runs in its own goroutine (see goRelease), so
// that the end of one allocation is acted on while another slot's release
// is still running.
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
		if _, err := m.releasePass(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("release pass incomplete", "error", err)
		}
	}
}

// ReleaseEnded is one pass of Run that also waits for the releases it
// started or found running: on return, every slot that could be released
// has been (or its error is returned).
func (m *Manager) ReleaseEnded(ctx context.Context) error {
	runs, err := m.releasePass(ctx)
	errs := []error{err}
	for _, r := range runs {
		select {
		case <-r.done:
			errs = append(errs, r.err)
		case <-ctx.Done():
			return errors.Join(append(errs, ctx.Err())...)
		}
	}
	return errors.Join(errs...)
}

// releasePass, from one read of the node's allocations that began now,
// starts the release of every reserved slot that may be released (decide),
// makes sure every started release is being carried out, then records the
// owners identified at Reserve. It returns the release runs it started or
// joined, without waiting for them. A slot that may not be
// released is kept, with why in its health: unhealthy when its owner is
// unknown or cannot be verified, or when something holds it that should
// not (conflict). No lock is held while the API is read.
func (m *Manager) releasePass(ctx context.Context) ([]*releaseRun, error) {
	m.mu.Lock()
	nomad := m.nomad
	m.mu.Unlock()
	if nomad == nil {
		return nil, nil
	}
	runs, err := m.startReleases(ctx, nomad)
	// Then the owners identified at Reserve, after the releases have
	// started: a release records its owner itself.
	m.mu.Lock()
	pending := maps.Clone(m.owners)
	m.mu.Unlock()
	errs := []error{err}
	for _, id := range slices.Sorted(maps.Keys(pending)) {
		if err := m.recordOwner(ctx, id, pending[id]); err != nil {
			errs = append(errs, err)
		}
	}
	return runs, errors.Join(errs...)
}

// startReleases is the part of releasePass that reads the API and starts
// the releases.
func (m *Manager) startReleases(ctx context.Context, nomad Nomad) ([]*releaseRun, error) {
	var errs []error
	// Every device's health warns while the token may not see every
	// namespace, whether or not a slot is in use.
	m.setIncomplete(nomad.Incomplete(ctx))
	// Decisions are made from this copy; a release starts only while the
	// slot is still the version decided from (startReleaseLocked).
	slots := m.Slots()
	var reserved []Slot
	var runs []*releaseRun
	for _, s := range slots {
		switch {
		case s.unreadable:
		case s.State == StateReleasing || s.State == StateDestroying:
			runs = append(runs, m.goRelease(ctx, s, false, Owner{}))
		case s.State == StateReserved:
			reserved = append(reserved, s)
		}
	}
	if len(reserved) == 0 {
		return runs, errors.Join(errs...)
	}
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
		return runs, errors.Join(errs...)
	}
	m.setIncomplete(v.Incomplete)
	for _, s := range reserved {
		d := m.decide(ctx, nomad, v, s, false)
		switch d.kind {
		case inUse:
			m.setNote(s.ID, note{})
		case startRelease:
			m.log.Info("owner ended", "device", s.ID, "owner", s.Owner.String(), "reason", d.reason)
			runs = append(runs, m.goRelease(ctx, s, true, Owner{}))
		default:
			m.setNote(s.ID, note{unhealthy: true, text: d.reason})
		}
	}
	return runs, errors.Join(errs...)
}

// runTimeout bounds one release run.
const runTimeout = 5 * time.Minute

// releaseRun is the release of one slot, carried out by one goroutine.
type releaseRun struct {
	done chan struct{} // closed when the run ends; err is set before
	err  error
}

// goRelease carries out the release of s in a goroutine of its own,
// starting it first (startReleaseLocked) when start is set, and returns the
// run; when a run for the slot is already going, it returns that one
// instead. A known asker (the allocation whose Reserve found s to release)
// gets the fresh dataset made for it: created reserved, with it as owner.
// The run ends when the release is done, fails (logged at error level, and
// retried by a later pass) or ctx is done. Runs on different slots go side
// by side; on one slot, the slot's lock orders a run against other work.
func (m *Manager) goRelease(ctx context.Context, s Slot, start bool, asker Owner) *releaseRun {
	m.mu.Lock()
	if r, ok := m.runs[s.ID]; ok {
		m.mu.Unlock()
		return r
	}
	r := &releaseRun{done: make(chan struct{})}
	m.runs[s.ID] = r
	m.mu.Unlock()
	// The run outlives the caller that started it (a Reserve that gives
	// up, say): others may have joined it, and a release cut short only
	// costs a retry. Each command has its own deadline; runTimeout bounds
	// the waits for the slot's lock.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runTimeout)
	go func() {
		defer func() {
			cancel()
			m.mu.Lock()
			delete(m.runs, s.ID)
			m.mu.Unlock()
			close(r.done)
		}()
		r.err = m.release(rctx, s, start, asker)
		if r.err != nil {
			m.log.Error("release incomplete; retried at the next pass", "device", s.ID, "error", r.err)
		}
	}()
	return r
}

// release starts (when start is set) and carries out the release of s,
// holding the slot's lock from start to end: what startRelease wrote is
// still what ZFS has when the first steps are decided from it.
func (m *Manager) release(ctx context.Context, s Slot, start bool, asker Owner) error {
	unlock, err := m.lockSlot(ctx, s.ID)
	if err != nil {
		return fmt.Errorf("releasing %s: %w", s.ID, err)
	}
	var known *zfs.Dataset
	if start {
		begun, err := m.startReleaseLocked(ctx, s)
		if err != nil || !begun {
			unlock()
			return err
		}
		cur, ok := m.slot(s.ID)
		if !ok || (cur.State != StateReleasing && cur.State != StateDestroying) {
			unlock()
			return nil
		}
		s = cur
		known = m.knownRelease(s) // nil: the first steps are decided from a read
	}
	return m.releaseSlotLocked(ctx, s, known, asker, unlock)
}

// ownerLockWait bounds how long a release pass waits for a slot's lock to
// record its owner, so that work on one slot does not hold up the pass.
const ownerLockWait = 100 * time.Millisecond

// recordOwner writes an owner identified at Reserve on the slot's dataset
// (one zfs command), unless the slot changed since. When other work holds
// the slot, the owner stays pending for the next pass.
func (m *Manager) recordOwner(ctx context.Context, id string, o Owner) error {
	lctx, cancel := context.WithTimeout(ctx, ownerLockWait)
	unlock, err := m.lockSlot(lctx, id)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("recording the owner of %s: %w", id, ctx.Err())
		}
		return nil // other work on the slot: still pending, the next pass records it
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

// startReleaseLocked records, under the slot's lock (held by the caller),
// that the release of s has begun: the owner (when not recorded yet) and
// the dataset's fate (archived, or destroying when the class says so), in
// one zfs command where only the state is new. It reports whether it did:
// it does nothing when the slot changed since s was read. When ZFS refuses
// (a full pool), the slot is kept, unhealthy with why.
func (m *Manager) startReleaseLocked(ctx context.Context, s Slot) (begun bool, err error) {
	cur, ok := m.slot(s.ID)
	if !ok || cur.ver != s.ver || cur.State != StateReserved || cur.Owner.AllocID != s.Owner.AllocID {
		// Changed since the decision (reserved again, owner recorded,
		// released): decide again from a new read.
		return false, nil
	}
	m.mu.Lock()
	c := classByName(m.cfg, s.Class)
	m.mu.Unlock()
	state := StateReleasing
	if c.OnRelease == OnReleaseDestroy {
		state = StateDestroying
	}
	props := map[string]string{PropState: string(fateOf(state))}
	if s.Owner.Known() && !cur.stamped.Known() {
		props[PropOwner] = s.Owner.Encode()
	}
	if err := m.setProps(ctx, s.Dataset, props); err != nil {
		m.setNote(s.ID, note{unhealthy: true, text: fmt.Sprintf("release blocked: %v; its data is kept", err)})
		return false, fmt.Errorf("starting the release of %s: %w", s.ID, err)
	}
	m.mu.Lock()
	delete(m.owners, s.ID)
	delete(m.notes, s.ID)
	m.mu.Unlock()
	m.updateSlot(s.ID, func(x *Slot) {
		x.State, x.Owner, x.stamped = state, s.Owner, s.Owner
		x.setHealth(false, releasingReason(*x))
		x.inRelease = true
	})
	m.log.Info("release started", "device", s.ID, "dataset", s.Dataset, "owner", s.Owner.String(), "on_release", c.OnRelease)
	return true, nil
}

// knownRelease returns the slot's dataset as ZFS has it once its release has
// begun (releasingDataset), or nil when the plugin is not sure enough to
// decide the first steps without a read: the archive container was not
// confirmed by the last full read, the class is no longer configured, or
// the host's mount table does not say plainly whether the dataset is
// mounted at the slot's mountpoint.
func (m *Manager) knownRelease(s Slot) *zfs.Dataset {
	m.mu.Lock()
	ready, configured := m.archiveReady, classByName(m.cfg, s.Class).Name == s.Class
	m.mu.Unlock()
	if !ready || !configured || s.Mountpoint == "" {
		return nil
	}
	table, err := hostfs.ReadTable()
	if err != nil {
		return nil
	}
	mounted := false
	if mnt, ok := table.At(s.Mountpoint); ok {
		if mnt.Source != s.Dataset {
			return nil
		}
		mounted = true
	}
	d := releasingDataset(s, mounted)
	return &d
}

// fateOf is what a slot being released records as its state on ZFS: the
// dataset's fate (see StateReleasing).
func fateOf(state State) State {
	if state == StateReleasing {
		return StateArchived
	}
	return state
}

// releasingDataset is the dataset of slot s (being released) as ZFS has it
// once its release has begun: its fate as its state, its owner, mounted or
// not, and canmount not yet changed. The release's first steps are decided
// from it without reading ZFS again; a step that finds ZFS otherwise fails,
// and the next attempt reads.
func releasingDataset(s Slot, mounted bool) zfs.Dataset {
	local := func(v string) zfs.Prop { return zfs.Prop{Value: v, Source: "local"} }
	yes := "no"
	if mounted {
		yes = "yes"
	}
	props := map[string]zfs.Prop{
		PropManaged: local(ManagedSlot),
		PropState:   local(string(fateOf(s.State))),
		"mounted":   {Value: yes, Source: "-"},
		"canmount":  {Value: "on", Source: "default"},
	}
	if s.Owner.Known() {
		props[PropOwner] = local(s.Owner.Encode())
	}
	return zfs.Dataset{Name: s.Dataset, Props: props}
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

// releaseSlotLocked carries out the started release of one slot, under
// its lock (held by the caller, and given up through unlock before it
// returns). It reads only what the release touches (the parent, the slot's dataset,
// its class container, the archive container and, once renamed, the
// archived dataset), by name and without recursion, so one release costs
// the same few zfs commands whether the node has ten slots or a thousand.
// Each step is decided from what ZFS has just said, exactly as Sync would
// (converge), except the first steps of a release this run has just
// started, which are decided from known (see releasingDataset). When
// anything it reads is missing, or reading fails, it leaves the slot to a
// full Sync, which decides from the whole tree. On return the slot reflects
// what ZFS said; the error is nil only when the release is done.
func (m *Manager) releaseSlotLocked(ctx context.Context, s Slot, known *zfs.Dataset, asker Owner, unlock func()) error {
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()
	reason, err := m.checkPoolRecent(ctx, cfg)
	if err != nil {
		unlock()
		return fmt.Errorf("releasing %s: %w; its data is kept", s.ID, err)
	}
	if reason != "" {
		unlock()
		m.setUnavailable(cfg, reason)
		return fmt.Errorf("releasing %s: %s; its data is kept", s.ID, reason)
	}
	names := map[string]bool{cfg.Parent: true, cfg.ArchiveDataset(): true, s.Dataset: true, cfg.ClassDataset(s.Class): true}
	chains := map[string]bool{s.Dataset: true}
	var (
		errs   []error
		failed = make(map[string]string)
	)
	if known != nil {
		// Just started by this run: the first steps follow from what the
		// slot was and what startRelease wrote.
		actions := releaseSteps(cfg, classByName(cfg, s.Class), s.Index, *known, time.Now())
		if asker.Known() {
			for i, a := range actions {
				if a.Kind == CreateSlot && a.Dataset == s.Dataset {
					// Made for the asker: reserved, its owner recorded,
					// in the one command that creates it.
					props := maps.Clone(a.Props)
					props[PropState], props[PropOwner] = string(StateReserved), asker.Encode()
					actions[i].Props = props
				}
			}
		}
		done, errs2 := m.applyAll(ctx, cfg, actions, failed)
		errs = append(errs, errs2...)
		follow(done, names, chains)
	}
	read := func(ctx context.Context) ([]zfs.Dataset, error) {
		return m.zfs.GetNames(ctx, slices.Sorted(maps.Keys(names)), ObservedProps...)
	}
	datasets, err := m.converge(ctx, cfg, read, func(plan Plan) bool {
		var actions []Action
		for _, a := range plan.Actions {
			if chains[a.Chain] {
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
			level = hclog.Debug // a dataset the release expected is not there: the full sync sorts it out
		}
		m.log.Log(level, "release: targeted read failed; falling back to a full sync", "device", s.ID, "error", err)
		// The full sync decides again from the whole tree, steps that
		// failed here included: its outcome is the release's.
		if err := m.Sync(ctx); err != nil {
			return err
		}
		if cur, ok := m.slot(s.ID); ok && (cur.State == StateReleasing || cur.State == StateDestroying) {
			return fmt.Errorf("releasing %s: not finished (%s)", s.ID, orDash(cur.HealthDesc))
		}
		return nil
	}
	var fresh []Slot
	for _, x := range buildSlots(cfg, datasets, "", failed) {
		if x.ID == s.ID {
			fresh = append(fresh, x)
		}
	}
	// A dataset made for the asker is readied on the host as a free one
	// would be, before Reserve hands it over.
	made := make([]bool, len(fresh))
	for i, x := range fresh {
		if asker.Known() && x.State == StateReserved && x.stamped.AllocID == asker.AllocID {
			made[i], fresh[i].State = true, StateFree
		}
	}
	errs = append(errs, prepareFree(cfg, fresh)...)
	for i := range fresh {
		if made[i] {
			fresh[i].State = StateReserved
		}
	}
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

// follow updates what a release reads next from what it did: the archived
// dataset under its new name, the fresh slot (none for a slot beyond the
// configured count), nothing that was destroyed.
func follow(done []Action, names, chains map[string]bool) {
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
