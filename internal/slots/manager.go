package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ZFS is what the manager needs from ZFS. *zfs.Client implements it.
type ZFS interface {
	Get(ctx context.Context, name string, depth int, props ...string) ([]zfs.Dataset, error)
	GetNames(ctx context.Context, names []string, props ...string) ([]zfs.Dataset, error)
	Create(ctx context.Context, name string, props map[string]string) error
	Set(ctx context.Context, name, prop, value string) error
	Destroy(ctx context.Context, name string) error
	DestroyRecursive(ctx context.Context, name, within string) error
	Unmount(ctx context.Context, name string) error
	Rename(ctx context.Context, from, to string) error
	PoolHealth(ctx context.Context, pool string) (string, error)
}

// Nomad is what the release logic needs to know of allocations. A nil Nomad
// means no slot is ever released.
type Nomad interface {
	// Holders returns the allocations (with the task) that hold the device
	// and have not ended, as the latest allocation list says.
	Holders(deviceID string) []Owner
	// Fate reports whether the owner's allocation has positively ended on
	// this node. Any doubt is an error, and means keep.
	Fate(ctx context.Context, o Owner) (Fate, error)
}

// Fate is what is known of an owner allocation.
type Fate struct {
	// Ended: it has positively stopped on this node.
	Ended bool
	// Stopping: not ended, but the servers want it stopped, so a new
	// Reserve for its device comes from another allocation.
	Stopping bool
	Reason   string
}

// soleHolder returns the one live holder of a device, if there is one.
func soleHolder(n Nomad, id string) (Owner, bool) {
	h := n.Holders(id)
	if len(h) != 1 {
		return Owner{}, false
	}
	return h[0], true
}

// Usage is the space accounting of one slot, in bytes.
type Usage struct {
	Used, Available, Referenced, Quota uint64
	CompressRatio                      float64
}

// Slot is one device instance as last observed.
type Slot struct {
	ID         string // "<class>-<index>"
	Class      string
	Index      int
	Dataset    string
	Mountpoint string // host path; empty when not mounted
	State      State
	Owner      Owner // stamped after Reserve; zero while unknown
	Healthy    bool
	HealthDesc string
	// Surplus is true for an in-use slot whose index is at or beyond the
	// configured count: it is kept until released, and offered to no one.
	Surplus bool
	Usage   Usage

	// stamped is the owner as recorded on the dataset.
	stamped Owner
}

// Manager owns the slots of one plugin instance. Its methods are safe for
// concurrent use.
type Manager struct {
	zfs ZFS
	log hclog.Logger

	// opMu serialises everything that writes to ZFS (Sync, Reserve), so a
	// slot is never destroyed by Sync while Reserve claims it.
	opMu sync.Mutex

	// refreshMu makes concurrent RefreshIfOlder calls share one zfs get.
	refreshMu sync.Mutex

	// kick wakes Run to release ended slots and stamp owners.
	kick chan struct{}

	// mu guards the fields below. It is never held while a zfs command runs.
	mu       sync.Mutex
	cfg      Config
	nomad    Nomad
	slots    []Slot // sorted by class, then index
	byID     map[string]int
	usageAt  time.Time // when the usage figures were last read
	reported map[string]bool
	// owners are owners learned at Reserve and not yet stamped, by ID.
	owners map[string]Owner
	// notes explain why an in-use slot is kept, by ID.
	notes map[string]string
	// changed is closed and replaced whenever the slot list is replaced.
	changed chan struct{}
}

// NewManager returns a manager that reaches ZFS through z.
func NewManager(z ZFS, log hclog.Logger) *Manager {
	return &Manager{
		zfs: z, log: log, kick: make(chan struct{}, 1),
		byID: map[string]int{}, reported: map[string]bool{},
		owners: map[string]Owner{}, notes: map[string]string{}, changed: make(chan struct{}),
	}
}

// SetNomad sets where the manager learns about allocations. Until it is
// set, nothing is ever released.
func (m *Manager) SetNomad(n Nomad) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nomad = n
}

// Changed returns a channel that is closed at the next change of the slot
// list.
func (m *Manager) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Kick asks Run to look for ended allocations now. It never blocks.
func (m *Manager) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// SetConfig replaces the configuration. Nothing changes on ZFS until the
// next Sync; until then the slots of the new configuration are reported as
// "not yet provisioned".
func (m *Manager) SetConfig(cfg Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg = cfg
	m.setSlotsLocked(buildSlots(cfg, nil, "not yet provisioned", nil))
}

// CheckParent verifies that the parent dataset exists, with one zfs command.
func (m *Manager) CheckParent(ctx context.Context, parent string) error {
	_, err := m.zfs.Get(ctx, parent, 0, "mounted")
	if errors.Is(err, zfs.ErrNotExist) {
		return fmt.Errorf("parent_dataset %q does not exist: create it first (zfs create %s)", parent, parent)
	}
	if err != nil {
		return fmt.Errorf("parent_dataset %q cannot be read: %w", parent, err)
	}
	return nil
}

// Slots returns a copy of every slot, sorted by class then index.
func (m *Manager) Slots() []Slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Slot(nil), m.slots...)
}

// UsageAge returns how long ago the usage figures were read from ZFS.
func (m *Manager) UsageAge() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.usageAt.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return time.Since(m.usageAt)
}

// Sync observes ZFS and brings it to the configuration: it creates missing
// class datasets and slots, destroys free slots beyond the count, fixes the
// quota and root directory owner and mode of free slots, and carries every
// started release to its end (archive or destroy, then a fresh dataset). It
// runs one `zpool list` and one batched `zfs get`, plus, only when it
// changed something, one command per change and one more `zfs get`. When
// the pool is not ONLINE or the parent is missing it changes nothing and
// marks every slot unhealthy. On return the slot list reflects what ZFS
// said; the error reports changes that failed (their slots are unhealthy).
func (m *Manager) Sync(ctx context.Context) error {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	return m.syncLocked(ctx)
}

// maxRounds bounds the observe-and-act rounds of one Sync. A release takes
// one round, the fresh dataset's owner and mode a second look.
const maxRounds = 3

func (m *Manager) syncLocked(ctx context.Context) error {
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()

	if reason := m.checkPool(ctx, cfg); reason != "" {
		m.setUnavailable(cfg, reason)
		return nil
	}
	var (
		datasets []zfs.Dataset
		errs     []error
		failed   = make(map[string]string)
	)
	for round := 0; ; round++ {
		var err error
		datasets, err = m.zfs.Get(ctx, cfg.Parent, 2, ObservedProps...)
		if err != nil {
			m.setUnavailable(cfg, parentReason(cfg.Parent, err))
			return errors.Join(errs...)
		}
		if round == maxRounds {
			break
		}
		plan := MakePlan(cfg, datasets, time.Now())
		m.reportForeign(plan.Foreign)
		plan.Actions = dropFailed(plan.Actions, failed)
		if len(plan.Actions) == 0 {
			break
		}
		_, errs2 := m.applyAll(ctx, cfg, plan.Actions, failed)
		errs = append(errs, errs2...)
	}

	slots := buildSlots(cfg, datasets, "", failed)
	errs = append(errs, ensureRoots(cfg, slots)...)
	m.mu.Lock()
	m.setSlotsLocked(slots)
	m.usageAt = time.Now()
	m.mu.Unlock()
	return errors.Join(errs...)
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
			if errors.Is(err, zfs.ErrBusy) {
				reason = fmt.Sprintf("%s: dataset is busy (a process still has it open); retrying", a.Kind)
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

// Refresh reads usage figures with one batched `zfs get` and updates them on
// the known slots. It changes neither state nor health, and writes nothing.
func (m *Manager) Refresh(ctx context.Context) error {
	m.mu.Lock()
	parent := m.cfg.Parent
	m.mu.Unlock()
	datasets, err := m.zfs.Get(ctx, parent, 2, ObservedProps...)
	if err != nil {
		return fmt.Errorf("reading usage under %s: %w", parent, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range datasets {
		if i, ok := m.byDataset(d.Name); ok {
			m.slots[i].Usage = usageOf(d)
		}
	}
	m.usageAt = time.Now()
	return nil
}

// RefreshIfOlder runs Refresh unless the usage figures are younger than
// maxAge. Concurrent callers wait for one refresh rather than each running
// their own.
func (m *Manager) RefreshIfOlder(ctx context.Context, maxAge time.Duration) error {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	if m.UsageAge() < maxAge {
		return nil
	}
	return m.Refresh(ctx)
}

// Reserve marks the slots with the given device IDs reserved, durably, and
// returns them in the order given. All IDs must belong to one class. A free,
// healthy slot costs one zfs command; a slot already reserved by a live
// allocation costs none (Nomad calls Reserve again when a task restarts).
//
// Nomad's scheduler treats a device as free as soon as its allocation is
// terminal, so it may hand out a slot that still holds the previous tenant's
// data. Such a slot (or one being released) is released first: Reserve
// waits, until ctx is done, for the fresh dataset to be in place. When it
// cannot tell whether the previous owner has ended, it waits as well, and
// fails at the deadline with the reason.
func (m *Manager) Reserve(ctx context.Context, ids []string) ([]Slot, error) {
	if len(ids) == 0 {
		return nil, errors.New("no device IDs to reserve")
	}
	start := time.Now()
	for {
		changed := m.Changed()
		m.opMu.Lock()
		res, wait, err := m.tryReserveLocked(ctx, ids)
		m.opMu.Unlock()
		if err != nil || wait == "" {
			return res, err
		}
		m.log.Debug("reserve waiting", "devices", ids, "reason", wait)
		m.Kick()
		retry := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil, fmt.Errorf("%s; gave up after %s", wait, time.Since(start).Round(time.Second))
		case <-changed:
		case <-retry.C:
		}
		retry.Stop()
	}
}

// tryReserveLocked reserves the slots if it can now. When a slot must first
// be released (or its previous owner's fate is unknown) it starts what it can
// and returns a non-empty wait reason. opMu is held.
func (m *Manager) tryReserveLocked(ctx context.Context, ids []string) (res []Slot, wait string, err error) {
	m.mu.Lock()
	nomad := m.nomad
	res = make([]Slot, 0, len(ids))
	for _, id := range ids {
		i, ok := m.byID[id]
		if !ok {
			m.mu.Unlock()
			return nil, "", fmt.Errorf("unknown device ID %q: this node offers %s", id, m.idSummaryLocked())
		}
		s := m.slots[i]
		if len(res) > 0 && s.Class != res[0].Class {
			m.mu.Unlock()
			return nil, "", fmt.Errorf("device IDs %q and %q belong to different classes (%s, %s): reserve one class at a time", res[0].ID, id, res[0].Class, s.Class)
		}
		res = append(res, s)
	}
	m.mu.Unlock()

	var release []Slot
	for _, s := range res {
		switch {
		case s.State == StateReleasing || s.State == StateDestroying:
			wait = fmt.Sprintf("device %s is being released from %s", s.ID, s.Owner)
		case s.State == StateReserved && s.Owner.Known() && nomad != nil:
			fate, err := nomad.Fate(ctx, s.Owner)
			switch {
			case err != nil:
				wait = fmt.Sprintf("device %s still holds the data of %s, whose state cannot be read (%v)", s.ID, s.Owner, err)
			case fate.Ended:
				release = append(release, s)
				wait = fmt.Sprintf("device %s is being released from %s (%s)", s.ID, s.Owner, fate.Reason)
			case fate.Stopping || otherHolder(nomad.Holders(s.ID), s.Owner):
				// Another allocation asks while the owner is still
				// stopping: it gets the slot once the owner has ended.
				wait = fmt.Sprintf("device %s is still in use by %s, which is stopping (%s)", s.ID, s.Owner, fate.Reason)
			}
		case s.State == StateReserved:
			// Reserved by a live owner, or by one not yet known: a repeat.
		case !s.Healthy || s.Mountpoint == "":
			return nil, "", fmt.Errorf("device %s (dataset %s) cannot be reserved: %s", s.ID, s.Dataset, s.HealthDesc)
		}
	}
	for _, s := range release {
		if err := m.markReleaseLocked(ctx, s); err != nil {
			return nil, "", err
		}
	}
	if len(release) > 0 {
		go m.Kick()
	}
	if wait != "" {
		return nil, wait, nil
	}

	for i := range res {
		if res[i].State == StateReserved {
			continue
		}
		if err := m.zfs.Set(ctx, res[i].Dataset, PropState, string(StateReserved)); err != nil {
			return nil, "", fmt.Errorf("reserving device %s (dataset %s): %w", res[i].ID, res[i].Dataset, err)
		}
		res[i].State = StateReserved
		var owner Owner
		if nomad != nil {
			owner, _ = soleHolder(nomad, res[i].ID)
		}
		m.mu.Lock()
		if j, ok := m.byID[res[i].ID]; ok {
			m.slots[j].State = StateReserved
			m.slots[j].Owner = owner
		}
		if owner.Known() {
			m.owners[res[i].ID] = owner
		}
		m.mu.Unlock()
		m.log.Info("slot reserved", "device", res[i].ID, "dataset", res[i].Dataset, "owner", owner.String())
	}
	m.Kick() // stamp owners in the background, off Reserve's path
	return res, "", nil
}

// markReleaseLocked starts the release of a slot whose owner has ended:
// it records the release time, then the state that the next Sync carries
// out (releasing, or destroying when the class says so). opMu is held.
func (m *Manager) markReleaseLocked(ctx context.Context, s Slot) error {
	m.mu.Lock()
	c := classByName(m.cfg, s.Class)
	m.mu.Unlock()
	state := StateReleasing
	if c.OnRelease == OnReleaseDestroy {
		state = StateDestroying
	}
	now := time.Now().UTC().Format(time.RFC3339)
	if err := m.zfs.Set(ctx, s.Dataset, PropReleasedAt, now); err != nil {
		return fmt.Errorf("starting the release of %s: %w", s.ID, err)
	}
	if err := m.zfs.Set(ctx, s.Dataset, PropState, string(state)); err != nil {
		return fmt.Errorf("starting the release of %s: %w", s.ID, err)
	}
	m.mu.Lock()
	if j, ok := m.byID[s.ID]; ok {
		m.slots[j].State = state
		m.slots[j].Healthy = false
		m.slots[j].HealthDesc = fmt.Sprintf("releasing: %s has ended", s.Owner)
	}
	delete(m.notes, s.ID)
	m.mu.Unlock()
	m.log.Info("release started", "device", s.ID, "dataset", s.Dataset, "owner", s.Owner.String(), "on_release", c.OnRelease)
	return nil
}

// Run stamps owners and releases the slots of ended allocations whenever it
// is kicked (after Reserve, and by the caller on every new allocation list)
// and every period, until ctx is done.
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

// ReleaseEnded stamps the owners of reserved slots that do not carry one
// yet, then starts the release of every reserved slot whose owner has
// positively ended, and carries out every started release (see
// releaseLocked). A slot whose owner's fate cannot be read is kept, with the
// reason in its health text.
func (m *Manager) ReleaseEnded(ctx context.Context) error {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	m.mu.Lock()
	nomad := m.nomad
	slots := append([]Slot(nil), m.slots...)
	m.mu.Unlock()
	if nomad == nil {
		return nil
	}
	var errs []error
	var releasing []Slot
	for _, s := range slots {
		switch s.State {
		case StateReleasing, StateDestroying:
			releasing = append(releasing, s)
			continue
		case StateReserved:
		default:
			continue
		}
		if !s.Owner.Known() {
			if o, ok := soleHolder(nomad, s.ID); ok {
				s.Owner = o
			}
		}
		if !s.Owner.Known() {
			m.setNote(s.ID, "in use by an allocation not yet identified; kept")
			continue
		}
		if err := m.stampOwnerLocked(ctx, s); err != nil {
			errs = append(errs, err)
			continue
		}
		fate, err := nomad.Fate(ctx, s.Owner)
		if err != nil {
			m.setNote(s.ID, fmt.Sprintf("in use by %s; kept: %v", s.Owner, err))
			m.log.Warn("cannot tell whether the owner has ended; keeping the dataset", "device", s.ID, "owner", s.Owner.String(), "error", err)
			continue
		}
		if !fate.Ended {
			m.setNote(s.ID, "")
			continue
		}
		m.log.Info("owner ended", "device", s.ID, "owner", s.Owner.String(), "reason", fate.Reason)
		if err := m.markReleaseLocked(ctx, s); err != nil {
			errs = append(errs, err)
			continue
		}
		releasing = append(releasing, s)
	}
	if len(releasing) > 0 {
		errs = append(errs, m.releaseLocked(ctx, releasing))
	}
	return errors.Join(errs...)
}

// releaseLocked carries out the started releases of the given slots. It
// reads only what those releases touch (the slots' datasets, their
// class containers, the archive container and, once renamed, the archived
// datasets), by name and without recursion, so one release costs the same
// few zfs commands whether the node has ten slots or a thousand. Only the
// steps of those releases are taken, each decided from what ZFS has just
// said, exactly as Sync would. When anything it reads is missing, or reading
// fails, it falls back to a full Sync, which decides from the whole tree.
// On return those slots reflect what ZFS said. opMu is held.
func (m *Manager) releaseLocked(ctx context.Context, rel []Slot) error {
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()
	if reason := m.checkPool(ctx, cfg); reason != "" {
		m.setUnavailable(cfg, reason)
		return nil
	}
	names := map[string]bool{cfg.ArchiveDataset(): true}
	chains := map[string]bool{}
	scoped := map[string]bool{}
	for _, s := range rel {
		names[s.Dataset], names[cfg.ClassDataset(s.Class)] = true, true
		chains[s.Dataset], scoped[s.ID] = true, true
	}
	var (
		datasets []zfs.Dataset
		errs     []error
		failed   = make(map[string]string)
	)
	for round := 0; ; round++ {
		var err error
		datasets, err = m.zfs.GetNames(ctx, slices.Sorted(maps.Keys(names)), ObservedProps...)
		if err != nil {
			level := hclog.Warn
			if errors.Is(err, zfs.ErrNotExist) {
				level = hclog.Debug // a dataset the release expected is not there: the full sync sorts it out
			}
			m.log.Log(level, "release: targeted read failed; falling back to a full sync", "error", err)
			return errors.Join(append(errs, m.syncLocked(ctx))...)
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
	for _, s := range buildSlots(cfg, datasets, "", failed) {
		if scoped[s.ID] {
			fresh = append(fresh, s)
		}
	}
	errs = append(errs, ensureRoots(cfg, fresh)...)
	m.mu.Lock()
	merged := fresh
	for _, s := range m.slots {
		if !scoped[s.ID] {
			merged = append(merged, s)
		}
	}
	sortSlots(merged)
	m.setSlotsLocked(merged)
	m.mu.Unlock()
	return errors.Join(errs...)
}

// stampOwnerLocked writes the owner's identity on the dataset, one property
// per command (zfs-fuse sets one at a time), skipping what is already there.
func (m *Manager) stampOwnerLocked(ctx context.Context, s Slot) error {
	m.mu.Lock()
	var have Owner
	if j, ok := m.byID[s.ID]; ok {
		have = m.slots[j].stamped
	}
	m.mu.Unlock()
	if have == s.Owner {
		return nil
	}
	hv, want := have.values(), s.Owner.values()
	for i, p := range ownerProps {
		if hv[i] == want[i] || want[i] == "" {
			continue
		}
		if err := m.zfs.Set(ctx, s.Dataset, p, want[i]); err != nil {
			return fmt.Errorf("recording the owner of %s: %w", s.ID, err)
		}
	}
	m.mu.Lock()
	if j, ok := m.byID[s.ID]; ok {
		m.slots[j].Owner, m.slots[j].stamped = s.Owner, s.Owner
	}
	delete(m.owners, s.ID)
	m.mu.Unlock()
	m.log.Debug("owner recorded", "device", s.ID, "owner", s.Owner.String())
	return nil
}

// otherHolder reports whether an allocation other than owner holds the
// device.
func otherHolder(holders []Owner, owner Owner) bool {
	for _, h := range holders {
		if h.AllocID != owner.AllocID {
			return true
		}
	}
	return false
}

// setNote sets (or, with "", clears) why an in-use slot is kept, and
// publishes it in the slot's health text.
func (m *Manager) setNote(id, note string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.notes[id] == note {
		return
	}
	if note == "" {
		delete(m.notes, id)
	} else {
		m.notes[id] = note
	}
	if j, ok := m.byID[id]; ok && m.slots[j].State == StateReserved && m.slots[j].Healthy {
		slots := append([]Slot(nil), m.slots...)
		slots[j].HealthDesc = note
		m.setSlotsLocked(slots)
	}
}

// checkPool returns why the pool cannot be used, or "" when it is ONLINE.
func (m *Manager) checkPool(ctx context.Context, cfg Config) string {
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
	for i := range m.slots {
		m.slots[i].Healthy = false
		m.slots[i].HealthDesc = reason
	}
}

func (m *Manager) apply(ctx context.Context, cfg Config, a Action) error {
	switch a.Kind {
	case CreateClass, CreateSlot, CreateArchive:
		return m.zfs.Create(ctx, a.Dataset, a.Props)
	case DestroySlot:
		return m.zfs.Destroy(ctx, a.Dataset)
	case SetQuota:
		return m.zfs.Set(ctx, a.Dataset, "refquota", a.Value)
	case SetProp:
		return m.zfs.Set(ctx, a.Dataset, a.Prop, a.Value)
	case Unmount:
		return m.zfs.Unmount(ctx, a.Dataset)
	case RenameToArchive:
		return m.zfs.Rename(ctx, a.Dataset, a.Target)
	case DestroyArchived:
		// -r only ever inside the plugin's own archive tree.
		return m.zfs.DestroyRecursive(ctx, a.Dataset, cfg.ArchiveDataset())
	}
	return fmt.Errorf("unknown action %d", a.Kind)
}

// reportForeign logs each foreign dataset once per manager.
func (m *Manager) reportForeign(names []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range names {
		if !m.reported[n] {
			m.reported[n] = true
			m.log.Warn("dataset under the parent is not managed by this configuration; leaving it alone", "dataset", n)
		}
	}
}

func (m *Manager) setSlotsLocked(slots []Slot) {
	for i := range slots {
		s := &slots[i]
		if note := m.notes[s.ID]; note != "" && s.Healthy && s.State == StateReserved {
			s.HealthDesc = note
		}
		if o, ok := m.owners[s.ID]; ok && !s.Owner.Known() && s.State == StateReserved {
			s.Owner = o
		}
	}
	m.slots = slots
	m.byID = make(map[string]int, len(slots))
	for i, s := range slots {
		m.byID[s.ID] = i
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Manager) byDataset(name string) (int, bool) {
	rel, ok := strings.CutPrefix(name, m.cfg.Parent+"/")
	if !ok {
		return 0, false
	}
	class, idx, ok := strings.Cut(rel, "/")
	if !ok {
		return 0, false
	}
	i, ok := m.byID[DeviceID(class, parseIndex(idx))]
	return i, ok && m.slots[i].Dataset == name
}

func (m *Manager) idSummaryLocked() string {
	if len(m.slots) == 0 {
		return "no devices"
	}
	ids := make([]string, 0, len(m.slots))
	for _, s := range m.slots {
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ", ")
}

// buildSlots derives the slot list from the configuration and the observed
// datasets. With a non-empty unavailable reason every slot is unhealthy with
// it. failed maps datasets to the reason their last change failed.
func buildSlots(cfg Config, datasets []zfs.Dataset, unavailable string, failed map[string]string) []Slot {
	byName := make(map[string]zfs.Dataset, len(datasets))
	for _, d := range datasets {
		byName[d.Name] = d
	}
	var slots []Slot
	for _, c := range cfg.Classes {
		container, containerOK := byName[cfg.ClassDataset(c.Name)]
		max := c.Slots
		// In-use slots beyond the count stay visible until released.
		for _, d := range datasets {
			if parent, idx, ok := cutLast(d.Name); ok && parent == cfg.ClassDataset(c.Name) {
				if n := parseIndex(idx); n >= max && isManaged(d, ManagedSlot) && slotState(d) != StateFree {
					max = n + 1
				}
			}
		}
		for i := 0; i < max; i++ {
			s := Slot{ID: DeviceID(c.Name, i), Class: c.Name, Index: i, Dataset: cfg.SlotDataset(c.Name, i)}
			d, exists := byName[s.Dataset]
			if exists {
				s.State = slotState(d)
				s.Owner = ownerOf(d)
				s.stamped = s.Owner
				if mp, ok := d.Value("mountpoint"); ok && filepath.IsAbs(mp) {
					if mounted, _ := d.Value("mounted"); mounted == "yes" {
						s.Mountpoint = mp
					}
				}
				s.Usage = usageOf(d)
			}
			if i >= c.Slots {
				if !exists || !isManaged(d, ManagedSlot) || s.State == StateFree {
					continue // a gap, someone else's, or destroyed
				}
				s.Surplus = true
			}
			s.Healthy, s.HealthDesc = health(cfg, c, s, d, exists, container, containerOK, unavailable, failed)
			slots = append(slots, s)
		}
	}
	sortSlots(slots)
	return slots
}

// sortSlots orders slots by class, then index.
func sortSlots(slots []Slot) {
	sort.SliceStable(slots, func(i, j int) bool {
		if slots[i].Class != slots[j].Class {
			return slots[i].Class < slots[j].Class
		}
		return slots[i].Index < slots[j].Index
	})
}

func health(cfg Config, c Class, s Slot, d zfs.Dataset, exists bool, container zfs.Dataset, containerOK bool, unavailable string, failed map[string]string) (bool, string) {
	switch {
	case unavailable != "":
		return false, unavailable
	case failed[s.Dataset] != "":
		return false, failed[s.Dataset]
	case containerOK && !isManaged(container, ManagedClass):
		return false, fmt.Sprintf("dataset %s exists but is not managed by nomad-device-zfs; left alone", cfg.ClassDataset(c.Name))
	case !exists:
		return false, fmt.Sprintf("dataset %s is missing", s.Dataset)
	case !isManaged(d, ManagedSlot):
		return false, fmt.Sprintf("dataset %s exists but is not managed by nomad-device-zfs; left alone", s.Dataset)
	case s.State == StateReleasing || s.State == StateDestroying:
		return false, fmt.Sprintf("releasing: %s has ended; its dataset is being %s", s.Owner, map[State]string{StateReleasing: "archived", StateDestroying: "destroyed"}[s.State])
	case s.Surplus:
		return false, fmt.Sprintf("slot index %d is beyond slots = %d: removed once released", s.Index, c.Slots)
	case s.Mountpoint == "":
		mounted, _ := d.Value("mounted")
		mp, _ := d.Value("mountpoint")
		return false, fmt.Sprintf("dataset %s is not mounted (mounted=%s, mountpoint=%s)", s.Dataset, orDash(mounted), orDash(mp))
	case s.State != StateFree && s.State != StateReserved:
		return false, fmt.Sprintf("dataset %s has unknown state %q", s.Dataset, s.State)
	}
	return true, ""
}

func usageOf(d zfs.Dataset) Usage {
	var u Usage
	u.Used, _ = d.Bytes("used")
	u.Available, _ = d.Bytes("available")
	u.Referenced, _ = d.Bytes("referenced")
	u.Quota, _ = d.Bytes("refquota")
	if v, ok := d.Value("compressratio"); ok {
		u.CompressRatio, _ = zfs.ParseRatio(v)
	}
	return u
}

// ensureRoots gives the root directory of every healthy free slot the class
// owner and mode. A slot where that fails is marked unhealthy with why.
func ensureRoots(cfg Config, slots []Slot) []error {
	var errs []error
	for i := range slots {
		s := &slots[i]
		if !s.Healthy || s.State != StateFree {
			continue
		}
		c := classByName(cfg, s.Class)
		if err := ensureRoot(s.Mountpoint, c.UID, c.GID, c.Mode); err != nil {
			s.Healthy = false
			s.HealthDesc = fmt.Sprintf("cannot set owner and mode of %s: %v", s.Mountpoint, err)
			errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
		}
	}
	return errs
}

// ensureRoot gives the root directory of a free slot the class owner and
// mode, touching it only when they differ.
func ensureRoot(dir string, uid, gid int, mode os.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid || int(st.Gid) != gid {
		if err := os.Lchown(dir, uid, gid); err != nil {
			return err
		}
	}
	if fi.Mode().Perm() != mode.Perm() {
		return os.Chmod(dir, mode.Perm())
	}
	return nil
}

func cutLast(name string) (parent, last string, ok bool) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
