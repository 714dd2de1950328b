package slots

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/apply"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/fate"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/hold"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/pool"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/prepare"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/proofs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reserve"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/restore"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/spare"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/starts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/tenancy"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ZFS is what the manager needs from ZFS: the reads, and what carrying
// out a plan writes (package apply's ZFS: create, clone, set, destroy,
// mount, rename). *zfs.Client implements it.
type ZFS interface {
	apply.ZFS
	Get(ctx context.Context, name string, depth int, props ...string) ([]zfs.Dataset, error)
	GetNames(ctx context.Context, names []string, props ...string) ([]zfs.Dataset, error)
	PoolHealth(ctx context.Context, pool string) (string, error)
}

// Manager owns the slots of one plugin instance. Its methods are safe for
// concurrent use.
//
// Locks, in the order they are taken:
//   - syncMu serialises Syncs. Slot work never takes it, so a Sync never
//     makes a slot wait.
//   - treeMu orders the few tree-wide changes (creating the class and
//     archive containers) against work on single slots: those hold it for
//     writing, and only when they get it at once (TryLock); Reserve, the
//     release of a slot and the recording of an owner hold it for reading.
//   - slotLock(id) serialises the zfs work on one slot, so that work on
//     different slots runs side by side; a wait for it ends with the
//     waiter's context. Sync takes a slot's lock only when it is free and
//     no run works on the slot (m.runs), and leaves a busy slot to its
//     holder. The one zfs work on a slot done without its lock is a run's
//     release of the slot's old dataset, up to its rename: nothing else
//     touches that dataset (see tend.outside). No Nomad call is ever made while
//     one is held, and each zfs command has the runner's timeout. While the
//     proof behind a prepared slot's Reserve is under way (m.proofs,
//     proof.go), lockSlot waits for it before it takes the slot's lock,
//     and Sync leaves the slot alone.
//   - mu guards the shared view (the fields after it). It is never held
//     while a zfs command or a Nomad call runs.
type Manager struct {
	zfs ZFS
	log hclog.Logger

	syncMu sync.Mutex
	treeMu sync.RWMutex

	// refreshMu makes concurrent RefreshIfOlder calls share one zfs get.
	refreshMu sync.Mutex

	// kick wakes Run to record owners and release ended slots.
	kick chan struct{}

	// The manager's parts, each with a lock of its own that guards its
	// own fields only. Each is the last lock taken (mu may be held when
	// it is taken, never the other way round), and none is held while a
	// command runs:
	//   - arm is what this run knows of armed datasets (package armed); m.zfs
	//     reads and creates through it.
	//   - starts is when tasks' starts are under way, which background
	//     slot work yields to (package starts).
	//   - holds are the slots held for their next tenant (package hold).
	//   - preps are the slots prepared at placement and not claimed by a
	//     Reserve yet, and the Reserves under way (package preps; package prepare).
	//   - proofs are the gates of the proofs made behind a prepared slot's
	//     Reserve (package proofs; proof.go): until its proof answered no
	//     other work touches the slot (lockSlot waits, tryLockSlot
	//     refuses, release passes leave it, a Reserve of it waits); and
	//     how long a proof may read (identifyGrace; tests set another:
	//     export_test.go).
	//   - restorer restores archives at Reserve, and holds where they are
	//     found (package restore).
	//   - runs are the releases and spares being made in the background,
	//     one run per slot (package release; goRelease, goTend).
	//   - ten is what the manager knows of its slots' tenancies beyond ZFS
	//     (package tenancy): owners identified at Reserve and not recorded
	//     yet, unproven askers, notes, empty starts, releases begun, fates
	//     refused behind a handover. Every change of it is made with mu
	//     held, so that what one hold of mu reads of it and of the slot
	//     view agree; setSlotsLocked lays it over the view.
	//   - pool is when a check last found the pool ONLINE (package pool),
	//     which the work on one slot trusts for a moment.
	arm      *armed.Tracker
	runs     *release.Runs
	starts   starts.Yield
	holds    *hold.Holds
	preps    *preps.Record
	proofs   *proofs.Gates
	restorer *restore.Restorer
	ten      *tenancy.Record
	pool     *pool.Checker
	// preparer prepares slots at placement, and hands them to their
	// Reserve (package prepare); its record is preps.
	preparer *prepare.Preparer
	// reserver runs Reserve's rounds (package reserve), through the
	// manager (reserveSlots); it has no state of its own.
	reserver *reserve.Reserver
	// apply carries out a plan's actions on ZFS (package apply); it has
	// no state of its own.
	apply *apply.Applier
	// fates writes the fate of a dataset whose release begins (package
	// fate), through the manager (fateSlots); it has no state of its own.
	fates *fate.Writer
	// spares hands a slot's spare to the asker of a Reserve (package
	// spare), through the manager (spareSlots); it has no state of its
	// own.
	spares *spare.Hander
	// passer starts a release pass's releases (package release), through
	// the manager (releaseSlots); it has no state of its own.
	passer *release.Passer

	mu      sync.Mutex
	cfg     Config
	nomad   Nomad
	slots   []Slot // sorted by class, then index
	byID    map[string]int
	locks   map[string]chan struct{}
	usageAt time.Time // when the usage figures were last read
	// archiveReady: the last full read found the archive container, the
	// plugin's own; archiveUnmounted: with mountpoint none.
	archiveReady, archiveUnmounted bool
	// parentRoom is the parent's available space as last read with the
	// usage figures (ParentAvailable).
	parentRoom view.Room
	reported   map[string]bool
	// asked is when the latest Reserve arrived. A release pass started by
	// a kick decides from any read of the allocations that began after
	// it (see Run): that read shows every allocation a dataset may have
	// been handed to, so none is taken for gone.
	asked time.Time
	// incomplete is why the latest allocation view may miss allocations
	// (the token does not see every namespace); "" when it sees them all.
	incomplete string
	// changed is closed and replaced whenever the slot list changes.
	changed chan struct{}
	// vers counts, by ID, the changes slot work made to a slot's view;
	// busy counts the holders of a slot's lock doing slot work. A Sync
	// keeps the current view of a slot that was busy or changed while it
	// read ZFS, rather than install what it read.
	vers map[string]uint64
	busy map[string]int
	// holder says, by ID, what the holder of a slot's lock is doing
	// ("reserve", "release", "sync", …), for the log of a wait for it.
	holder map[string]string
	// obs is told of Reserve calls and releases (SetObserver); nil for none.
	obs Observer
}

// NewManager returns a manager that reaches ZFS through z.
func NewManager(z ZFS, log hclog.Logger) *Manager {
	a := armed.New()
	m := &Manager{
		zfs: armedZFS{ZFS: z, a: a}, arm: a, log: log, kick: make(chan struct{}, 1),
		byID: map[string]int{}, locks: map[string]chan struct{}{}, reported: map[string]bool{},
		changed: make(chan struct{}), ten: tenancy.New(),
		vers: map[string]uint64{}, busy: map[string]int{}, holder: map[string]string{}, runs: release.NewRuns(log),

		holds: hold.New(), preps: preps.NewRecord(), proofs: proofs.New(identifyGrace),
	}
	m.apply, m.pool = apply.New(m.zfs, log), pool.New(m.zfs)
	m.fates = fate.New(m.apply, fateSlots{m}, log)
	m.spares = spare.New(m.zfs, a, m.runs, m.fates, spareSlots{fateSlots{m}}, log)
	m.restorer = restore.New(m.zfs, restoreSlots{m}, log)
	m.preparer = prepare.New(prepareSlots{m}, prepareSlots{m}, m.preps, &m.starts, a, log)
	m.reserver = reserve.New(reserveSlots{m}, reserveSlots{m}, m.restorer, a, log)
	m.passer = release.NewPasser(log, a, releaseSlots{m}, releaseSlots{m})
	m.starts.Set(starts.Default)
	return m
}

// SetNomad sets where the manager learns about allocations. Until it is
// set, nothing is ever released and no used dataset is handed over.
func (m *Manager) SetNomad(n Nomad) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nomad = n
}

// SetStartYield sets how long the manager's background slot work (a
// release whose slot's spare serves meanwhile, the making of a spare)
// yields to a task's start, counted from the start and from the end of a
// slot's preparation at placement, and from the arrival and the answer of
// a Reserve; 0 turns it off. NewManager sets
// starts.Default. A Reserve never waits for it.
func (m *Manager) SetStartYield(d time.Duration) { m.starts.Set(d) }

// Changed returns a channel that is closed at the next change of the slot
// list, health included.
func (m *Manager) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Kick asks Run to look for ended allocations now. It never blocks.
func (m *Manager) Kick() { wake(m.kick) }

// SetConfig replaces the configuration. Nothing changes on ZFS until the
// next Sync; until then the slots of the new configuration are reported as
// "not yet provisioned".
func (m *Manager) SetConfig(cfg Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg = cfg
	m.setSlotsLocked(view.Build(cfg, nil, "not yet provisioned", nil))
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
		if i, ok := m.byDatasetLocked(d.Name); ok && d.Err == nil {
			m.slots[i].Usage = d.Usage()
		}
	}
	m.usageAt = time.Now()
	m.parentRoom = view.ParentRoomOf(parent, datasets)
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

// slot returns the current view of one slot.
func (m *Manager) slot(id string) (Slot, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[id]
	if !ok {
		return Slot{}, false
	}
	return m.slots[i], true
}

// updateSlot changes one slot of the shared view and publishes the change.
func (m *Manager) updateSlot(id string, fn func(*Slot)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[id]
	if !ok {
		return
	}
	slots := append([]Slot(nil), m.slots...)
	fn(&slots[i])
	m.vers[id]++
	m.setSlotsLocked(slots)
}

// setSlotsLocked installs a new slot list, with what the manager knows
// beyond ZFS laid over it, and wakes everyone waiting on Changed. mu is held.
func (m *Manager) setSlotsLocked(slots []Slot) {
	m.ten.Derive(slots, m.incomplete)
	view.KeepSchedulable(slots)
	m.slots = slots
	m.byID = make(map[string]int, len(slots))
	for i, s := range slots {
		m.byID[s.ID] = i
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Manager) byDatasetLocked(name string) (int, bool) {
	rel, ok := strings.CutPrefix(name, m.cfg.Parent+"/")
	if !ok {
		return 0, false
	}
	class, idx, ok := strings.Cut(rel, "/")
	if !ok {
		return 0, false
	}
	n, _ := record.SlotIndex(idx)
	i, ok := m.byID[record.DeviceID(class, n)]
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

// Wait returns once no work on a slot runs in the background (releases,
// spares being made), or with ctx's error when ctx is done first.
func (m *Manager) Wait(ctx context.Context) error {
	for {
		r := m.runs.Any()
		if r == nil {
			return nil
		}
		select {
		case <-r.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
