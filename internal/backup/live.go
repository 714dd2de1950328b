package backup

// Live backups: while a task holds a slot of a class with backup_interval,
// its dataset is snapshotted and sent into backup_dir every interval, so
// that a node lost with its task costs at most an interval (plus a send)
// of the task's writes. The streams continue the identity's chain: a live
// backup's snapshot is the base of the next one, and of the archive's at
// release (the dataset is renamed into the archive, snapshots and all).

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// LiveSnapshotPrefix starts the name of the keeper's snapshots of
// datasets in use (within SnapshotPrefix): never sent as an archive's
// final state.
const LiveSnapshotPrefix = SnapshotPrefix + "live-"

// snapTimeFormat is the time in the names of the keeper's snapshots, after
// SnapshotPrefix (UTC).
const snapTimeFormat = "20060102T150405.000000000Z"

// LiveFullEvery is how many increments a chain holds before a live backup
// starts a new one: live backups come every backup_interval, and a full
// stream of a large dataset that often would cost more than it saves. The
// size rule (increments as heavy as the full stream) still applies.
const LiveFullEvery = 64

// liveIdle is how long RunLive sleeps when no class has backup_interval.
const liveIdle = time.Minute

// takenSince reports whether the keeper's snapshot name (of an archive)
// was taken in the second of release time t or later (t is to the second):
// a snapshot older than the release holds an earlier tenant's data.
func takenSince(name string, t time.Time) bool {
	_, at, ok := strings.Cut(name, "@"+SnapshotPrefix)
	if !ok {
		return false
	}
	taken, err := time.Parse(snapTimeFormat, at)
	return err == nil && !taken.Before(t.Truncate(time.Second))
}

// liveProps are what LivePass reads of each slot dataset.
var liveProps = append([]string{"guid", record.PropManaged, record.PropState, record.PropKeyID, record.PropDataFrom}, record.OwnerProps...)

// liveMark is a dataset in use as the keeper last backed it up.
type liveMark struct {
	alloc string
	at    time.Time
}

// InUse is a slot's dataset in use, as LivePass reads it.
type InUse struct {
	retention.Archive
	// Interval is its class's backup_interval.
	Interval time.Duration
	// GUID is the dataset's, as read (0 when the read had none).
	GUID uint64
}

// liveRead is what a live pass read of a dataset in use, which its send
// takes instead of reading again: its GUID (0: not read; the send reads
// it before the snapshot), and its snapshots when the pass read them.
type liveRead struct {
	guid      uint64
	snaps     []zfs.Snap
	snapsRead bool
}

// ParseInUse sorts one read of a class's slot datasets (`zfs get -r -d 1`
// of classDataset, with liveProps) into those a live backup may send: the
// plugin's, reserved, of a known owner whose identity can be told from
// another's. It is a pure function.
func ParseInUse(class, classDataset string, ds []zfs.Dataset) []InUse {
	var out []InUse
	for _, d := range ds {
		leaf, ok := strings.CutPrefix(d.Name, classDataset+"/")
		if !ok || leaf == "" || strings.ContainsAny(leaf, "/@") || d.Err != nil {
			continue
		}
		index, _ := record.SlotIndex(leaf)
		stored, _ := d.Local(record.PropState)
		owner, _ := d.Local(record.PropOwner)
		if index < 0 || !record.IsManaged(d, record.ManagedSlot) || record.StateOf(stored, owner) != record.StateReserved {
			continue // an armed dataset with its owner recorded is in use too
		}
		o, err := record.RecordedOwner(d)
		if err != nil || !o.Known() || o.AllocIndex() < 0 || o.Truncated() {
			continue
		}
		keyID, _ := d.Local(record.PropKeyID)
		var guid uint64
		if v, ok := d.Value("guid"); ok {
			guid, _ = strconv.ParseUint(v, 10, 64)
		}
		out = append(out, InUse{Archive: retention.Archive{Name: d.Name, Class: class, Slot: index, Owner: o, AllocID: o.AllocID,
			Identity: retention.IdentityOf(class, o), KeyID: keyID, From: record.RecordedLineage(d)}, GUID: guid})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// RunLive makes live passes (LivePass) until ctx is done, each when the
// next dataset is due.
func (k *Keeper) RunLive(ctx context.Context) {
	cfg := loop.Config{Name: "live backup", Log: k.log, First: loop.After(0)}
	loop.Run(ctx, cfg, func(ctx context.Context, _ loop.Wake) loop.Next {
		_, next, err := k.LivePass(ctx)
		if err != nil && ctx.Err() == nil {
			k.log.Error("live backup pass incomplete", "error", err)
		}
		return loop.After(next)
	})
}

// LivePass sends a live backup of each dataset in use of the classes with
// backup_interval whose last live backup by this keeper is an interval old
// (or that it has not backed up since it started, or since a new tenant
// took it), up to BatchSize of them, longest due first. Passes and live
// passes are serialised; a live pass yields to an archive pass that waits
// for it after each send (next is then 0). next is when the next one is
// due.
func (k *Keeper) LivePass(ctx context.Context) (sent []Manifest, next time.Duration, err error) {
	k.passMu.Lock()
	defer k.passMu.Unlock()
	cfg, node := k.config()
	if cfg.Dir == "" || len(cfg.Live) == 0 {
		return nil, liveIdle, nil
	}
	classes := make([]string, 0, len(cfg.Live))
	for c := range cfg.Live {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	var errs []error
	var inUse []InUse
	for _, c := range classes {
		ds := cfg.ClassDatasets[c]
		if ds == "" {
			continue
		}
		read, err := k.zfs.Get(ctx, ds, 1, liveProps...)
		if errors.Is(err, zfs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the slots of class %q: %w", c, err))
			continue
		}
		for _, u := range ParseInUse(c, ds, read) {
			u.Interval = cfg.Live[c]
			inUse = append(inUse, u)
		}
	}
	// A dataset taken into use since is seen at the next read: within the
	// shortest interval.
	now := time.Now()
	next = liveIdle
	for _, d := range cfg.Live {
		next = min(next, d)
	}
	seen := map[string]bool{}
	var due []InUse
	var dueAt []time.Time
	for _, u := range inUse {
		seen[u.Name] = true
		mark, ok := k.live[u.Name]
		at := now // not backed up by this keeper, or a new tenant: due now
		if ok && mark.alloc == u.AllocID {
			at = mark.at.Add(u.Interval)
		}
		if at.After(now) {
			next = min(next, at.Sub(now))
			continue
		}
		due, dueAt = append(due, u), append(dueAt, at)
	}
	for name := range k.live {
		if !seen[name] {
			delete(k.live, name) // released: the archive pass takes over
		}
	}
	sort.SliceStable(due, func(i, j int) bool { return dueAt[i].Before(dueAt[j]) })
	if len(due) > BatchSize {
		due, next = due[:BatchSize], 0
	}
	// The snapshots of the due datasets: one read per class.
	snaps := map[string]map[string][]zfs.Snap{}
	for _, u := range due {
		if _, read := snaps[u.Class]; read {
			continue
		}
		under, err := k.zfs.SnapshotsUnder(ctx, cfg.ClassDatasets[u.Class])
		if err != nil {
			under = nil // each send reads its own
		}
		snaps[u.Class] = under
	}
	for i, u := range due {
		if i > 0 && k.releasesWaiting.Load() > 0 {
			// An archive pass waits: its release's final stream goes
			// first; the rest are due at once after it.
			next = 0
			break
		}
		under := snaps[u.Class]
		m, err := k.send(ctx, cfg, node, u.Archive, &liveRead{guid: u.GUID, snaps: under[u.Name], snapsRead: under != nil})
		// A failed one is tried again an interval later, not at once: a
		// full backup_dir or a dataset on its way out would otherwise
		// keep the loop busy.
		k.live[u.Name] = liveMark{alloc: u.AllocID, at: time.Now()}
		next = min(next, u.Interval)
		if errors.Is(err, zfs.ErrNotExist) || errors.Is(err, ErrChangedHands) {
			// Released (renamed into the archive) since the read: the
			// archive's pass sends it.
			k.log.Debug("a dataset in use left before its live backup", "dataset", u.Name, "error", err)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("live backup of %s: %w", u.Name, err))
			continue
		}
		sent = append(sent, m)
		k.log.Debug("dataset in use backed up", "dataset", u.Name, "identity", u.Identity.String(), "stream", m.StreamPath(), "bytes", m.Size, "incremental", m.BaseGUID != 0)
	}
	k.releasePending(ctx)
	for _, m := range sent {
		if err := k.prune(cfg, &m.Identity); err != nil {
			errs = append(errs, err)
		}
	}
	return sent, next, errors.Join(errs...)
}

// LiveSettle is how long a restore whose newest backup is a live one waits
// for that allocation's final stream before it takes the live one: a
// release sends it within seconds; a lost node never does.
var LiveSettle = 15 * time.Second

// ErrStale says that a restore found only data older than max_restore_lag
// (see StaleError).
var ErrStale = errors.New("older than max_restore_lag")

// StaleError is a restore refused because the newest backup of its
// identity is a live one older than the class's max_restore_lag: the
// allocation it was taken from may have written more since (its node
// lost), and the class wants no task started on older data.
type StaleError struct {
	Identity retention.Identity
	Newest   Manifest
	Age      time.Duration
	MaxLag   time.Duration
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("the newest backup of %s in backup_dir (%s) was taken %s ago while allocation %s ran on node %s, and no backup of its release followed: older than max_restore_lag = %s; "+
		"restore it by hand (docs/operations.md, \"Backups and a lost node\"), or raise max_restore_lag",
		e.Identity, e.Newest.Path(), e.Age, e.Newest.AllocID, orNone(e.Newest.Node), e.MaxLag)
}

// Unwrap makes errors.Is(err, ErrStale) hold.
func (e *StaleError) Unwrap() error { return ErrStale }

func orNone(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// newest returns the newest manifest of identity id in backup_dir whose
// allocation is not set aside (zero when there is none).
func (k *Keeper) newest(dir string, id retention.Identity) (Manifest, error) {
	all, _, err := List(dir, &id)
	ms := notSetAside(all)
	if err != nil || len(ms) == 0 {
		return Manifest{}, err
	}
	return ms[0], nil
}

// settle waits, up to LiveSettle and ctx, until the newest backup of id is
// no longer a live one.
func (k *Keeper) settle(ctx context.Context, dir string, id retention.Identity) {
	t := time.NewTimer(LiveSettle)
	defer t.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k.log.Info("the newest backup is a live one and no backup of its release came: taking it", "identity", id.String(), "waited", LiveSettle)
			return
		case <-tick.C:
			if m, err := k.newest(dir, id); err == nil && !m.Live {
				return
			}
		}
	}
}

// ErrChangedHands says that a dataset in use was released, or handed to
// another tenant, while its live backup was taken: nothing of it is sent.
var ErrChangedHands = errors.New("the dataset changed hands")

// inUseAs reads dataset a.Name and returns its GUID when it is still in use
// by a's allocation (the plugin's, reserved, that owner), or an error
// matching ErrChangedHands when it is not: a live backup takes its
// snapshot between two such reads of the same GUID, so that it never sends
// another dataset (a spare made under the name, another tenant's) as a's.
func (k *Keeper) inUseAs(ctx context.Context, a retention.Archive) (uint64, error) {
	ds, err := k.zfs.Get(ctx, a.Name, 0, append([]string{"guid"}, liveProps...)...)
	if err != nil {
		return 0, err
	}
	if len(ds) != 1 || ds[0].Name != a.Name || ds[0].Err != nil {
		return 0, fmt.Errorf("%s: not read as one dataset: %w", a.Name, ErrChangedHands)
	}
	d := ds[0]
	stored, _ := d.Local(record.PropState)
	owner, _ := d.Local(record.PropOwner)
	o, oerr := record.RecordedOwner(d)
	if !record.IsManaged(d, record.ManagedSlot) || record.StateOf(stored, owner) != record.StateReserved || oerr != nil || o.AllocID != a.AllocID {
		return 0, fmt.Errorf("%s: no longer in use by allocation %s: %w", a.Name, a.AllocID, ErrChangedHands)
	}
	v, _ := d.Value("guid")
	g, err := strconv.ParseUint(v, 10, 64)
	if err != nil || g == 0 {
		return 0, fmt.Errorf("%s: guid %q: %w", a.Name, v, ErrChangedHands)
	}
	return g, nil
}
