package slots

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	Create(ctx context.Context, name string, props map[string]string) error
	Set(ctx context.Context, name, prop, value string) error
	Destroy(ctx context.Context, name string) error
	PoolHealth(ctx context.Context, pool string) (string, error)
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
	Healthy    bool
	HealthDesc string
	// Surplus is true for an in-use slot whose index is at or beyond the
	// configured count: it is kept until released, and offered to no one.
	Surplus bool
	Usage   Usage
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

	// mu guards the fields below. It is never held while a zfs command runs.
	mu       sync.Mutex
	cfg      Config
	slots    []Slot // sorted by class, then index
	byID     map[string]int
	usageAt  time.Time // when the usage figures were last read
	reported map[string]bool
}

// NewManager returns a manager that reaches ZFS through z.
func NewManager(z ZFS, log hclog.Logger) *Manager {
	return &Manager{zfs: z, log: log, byID: map[string]int{}, reported: map[string]bool{}}
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
// class datasets and slots, destroys free slots beyond the count, and fixes
// the quota and root directory owner and mode of free slots. It runs one
// `zpool list` and one batched `zfs get` (a second one only when it changed
// something), plus one command per change. When the pool is not ONLINE or
// the parent is missing it changes nothing and marks every slot unhealthy.
// On return the slot list reflects what ZFS said; the error reports changes
// that failed (their slots are marked unhealthy too).
func (m *Manager) Sync(ctx context.Context) error {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	m.mu.Lock()
	cfg := m.cfg
	m.mu.Unlock()

	if reason := m.checkPool(ctx, cfg); reason != "" {
		m.setUnavailable(cfg, reason)
		return nil
	}
	datasets, err := m.zfs.Get(ctx, cfg.Parent, 2, ObservedProps...)
	if err != nil {
		m.setUnavailable(cfg, parentReason(cfg.Parent, err))
		return nil
	}

	plan := MakePlan(cfg, datasets)
	m.reportForeign(plan.Foreign)
	failed := make(map[string]string)
	var errs []error
	for _, a := range plan.Actions {
		if err := m.apply(ctx, a); err != nil {
			m.log.Error("slot change failed", "action", a.Kind.String(), "dataset", a.Dataset, "error", err)
			failed[a.Dataset] = fmt.Sprintf("%s failed: %v", a.Kind, err)
			errs = append(errs, fmt.Errorf("%s %s: %w", a.Kind, a.Dataset, err))
			if a.Kind == CreateClass {
				for i := 0; i < classByName(cfg, a.Class).Slots; i++ {
					failed[cfg.SlotDataset(a.Class, i)] = fmt.Sprintf("%s %s failed: %v", a.Kind, a.Dataset, err)
				}
			}
			continue
		}
		m.log.Info("slot changed", "action", a.Kind.String(), "dataset", a.Dataset)
	}
	if len(plan.Actions) > len(errs) {
		if datasets, err = m.zfs.Get(ctx, cfg.Parent, 2, ObservedProps...); err != nil {
			m.setUnavailable(cfg, parentReason(cfg.Parent, err))
			return errors.Join(append(errs, err)...)
		}
	}

	slots := buildSlots(cfg, datasets, "", failed)
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
	m.mu.Lock()
	m.setSlotsLocked(slots)
	m.usageAt = time.Now()
	m.mu.Unlock()
	return errors.Join(errs...)
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
// returns them in the order given. All IDs must belong to one class and be
// healthy (or already reserved). It runs at most one zfs command per slot
// that is not yet reserved, and none for a repeated call.
func (m *Manager) Reserve(ctx context.Context, ids []string) ([]Slot, error) {
	if len(ids) == 0 {
		return nil, errors.New("no device IDs to reserve")
	}
	m.opMu.Lock()
	defer m.opMu.Unlock()

	m.mu.Lock()
	res := make([]Slot, 0, len(ids))
	for _, id := range ids {
		i, ok := m.byID[id]
		if !ok {
			m.mu.Unlock()
			return nil, fmt.Errorf("unknown device ID %q: this node offers %s", id, m.idSummaryLocked())
		}
		s := m.slots[i]
		if len(res) > 0 && s.Class != res[0].Class {
			m.mu.Unlock()
			return nil, fmt.Errorf("device IDs %q and %q belong to different classes (%s, %s): reserve one class at a time", res[0].ID, id, res[0].Class, s.Class)
		}
		if s.Mountpoint == "" || (!s.Healthy && s.State != StateReserved) {
			m.mu.Unlock()
			return nil, fmt.Errorf("device %s (dataset %s) cannot be reserved: %s", id, s.Dataset, s.HealthDesc)
		}
		res = append(res, s)
	}
	m.mu.Unlock()

	for i := range res {
		if res[i].State == StateReserved {
			continue
		}
		if err := m.zfs.Set(ctx, res[i].Dataset, PropState, string(StateReserved)); err != nil {
			return nil, fmt.Errorf("reserving device %s (dataset %s): %w", res[i].ID, res[i].Dataset, err)
		}
		res[i].State = StateReserved
		m.mu.Lock()
		if j, ok := m.byID[res[i].ID]; ok {
			m.slots[j].State = StateReserved
		}
		m.mu.Unlock()
		m.log.Info("slot reserved", "device", res[i].ID, "dataset", res[i].Dataset)
	}
	return res, nil
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

func (m *Manager) apply(ctx context.Context, a Action) error {
	switch a.Kind {
	case CreateClass, CreateSlot:
		return m.zfs.Create(ctx, a.Dataset, a.Props)
	case DestroySlot:
		return m.zfs.Destroy(ctx, a.Dataset)
	case SetQuota:
		return m.zfs.Set(ctx, a.Dataset, "refquota", a.Value)
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
	m.slots = slots
	m.byID = make(map[string]int, len(slots))
	for i, s := range slots {
		m.byID[s.ID] = i
	}
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
	sort.SliceStable(slots, func(i, j int) bool {
		if slots[i].Class != slots[j].Class {
			return slots[i].Class < slots[j].Class
		}
		return slots[i].Index < slots[j].Index
	})
	return slots
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
