package backup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// SnapshotPrefix starts the name of every snapshot the keeper takes.
const SnapshotPrefix = "nomad-device-zfs-"

// SendTimeout bounds one `zfs send` into backup_dir.
const SendTimeout = time.Hour

// BatchSize bounds the archives one pass sends.
const BatchSize = 4

// ZFS is what the keeper needs from ZFS. *zfs.Client implements it.
type ZFS interface {
	retention.Reader
	Sender
	Receiver
	Snapshot(ctx context.Context, name string) error
	DestroySnapshot(ctx context.Context, name string) error
	Rename(ctx context.Context, from, to string) error
	Snapshots(ctx context.Context, dataset string) ([]zfs.Snap, error)
	SnapshotGUID(ctx context.Context, name string) (uint64, error)
	SnapshotsUnder(ctx context.Context, container string) (map[string][]zfs.Snap, error)
	Set(ctx context.Context, name, prop, value string) error
	DestroyRecursive(ctx context.Context, name, within string) error
}

// Config is what the keeper works to.
type Config struct {
	// Dir is backup_dir; "" for none (the keeper then does nothing).
	Dir string
	// Container is the archive container, <parent>/.archive.
	Container string
	// Classes are the classes whose archives go to Dir (restore on).
	Classes map[string]bool
	// KeyDir holds the keys of encrypted archives: sent beside their raw
	// streams, installed there at a receive.
	KeyDir string
	// Rules are the archive's retention rules; backup_dir keeps each
	// identity's streams by the same keep and max_age, by whole chains
	// (PlanPrune). Only the identities of Classes are pruned: backup_dir
	// may be shared with nodes that have other classes.
	Rules retention.Rules
	// FullEvery is how many increments a chain holds before the next
	// backup starts a new one (DefaultFullEvery when 0).
	FullEvery int
	// PruneGrace is how long a new chain exists before the chains it
	// replaces may be deleted (PruneGrace when 0; tests set less).
	PruneGrace time.Duration
	// Live are, by class, the backup_interval of the classes whose
	// datasets in use are backed up while their tasks run (LivePass);
	// ClassDatasets, by class (of Classes), the dataset that holds its
	// slots.
	Live          map[string]time.Duration
	ClassDatasets map[string]string
	// MaxLag are, by class, max_restore_lag: Fetch refuses a newest backup
	// that is a live one older than this.
	MaxLag map[string]time.Duration
}

// PruneScanPeriod is how often a pass reads the whole of backup_dir for
// chains to prune (max_age); in between, a pass prunes the identities it
// sent a backup of.
const PruneScanPeriod = time.Hour

// Keeper sends archives into backup_dir in the background, and receives
// an identity's backup at a restore on a node that has no archive of it.
// Its methods are safe for concurrent use.
type Keeper struct {
	zfs  ZFS
	log  hclog.Logger
	kick chan struct{}

	// passMu serialises passes; fetchMu serialises Fetches, so that two
	// restores of one identity never receive into the same name.
	passMu  sync.Mutex
	fetchMu sync.Mutex
	// releasesWaiting counts the archive passes (Pass) waiting for passMu:
	// a live pass yields to them between its sends (LivePass), so that a
	// release's final stream, which a restore elsewhere waits for
	// (LiveSettle), never waits behind a batch of live backups.
	releasesWaiting atomic.Int32
	// mu guards cfg and node.
	mu   sync.Mutex
	cfg  Config
	node string
	// scanned is when a pass last pruned the whole of backup_dir, live
	// the datasets in use as LivePass last backed them up, pending the
	// snapshots the pass's sends left to release; only passes (under
	// passMu) touch them.
	scanned time.Time
	live    map[string]liveMark
	pending []pendingRelease
	// summaries is backup_dir as the passes last listed it (summary.go).
	summaries summaries
	// onSent, set before Run (OnSent), is called after a pass that sent.
	onSent func()
}

// NewKeeper returns a keeper that reaches ZFS through z. It does nothing
// until SetConfig gives it a backup_dir.
func NewKeeper(z ZFS, log hclog.Logger) *Keeper {
	return &Keeper{zfs: z, log: log, kick: make(chan struct{}, 1), live: map[string]liveMark{}}
}

// SetConfig replaces the configuration, and makes backup_dir's
// nomad-device-zfs/ directory when backup_dir is there (EnsureRoot).
func (k *Keeper) SetConfig(cfg Config) {
	k.mu.Lock()
	k.cfg = cfg
	k.mu.Unlock()
	if cfg.Dir != "" {
		if err := EnsureRoot(cfg.Dir); err != nil {
			k.log.Warn("backup_dir is not usable yet: restores that need it wait (required) or start empty (best-effort)", "error", err)
		}
	}
}

// SetNode records the node ID written into manifests.
func (k *Keeper) SetNode(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.node = id
}

func (k *Keeper) config() (Config, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cfg, k.node
}

// Kick asks Run for a pass now. It never blocks.
func (k *Keeper) Kick() { loop.Kick(k.kick) }

// OnSent sets a function that Run calls, on its goroutine with no lock
// held, after a pass that sent and marked at least one archive: retention
// prunes no archive of a class with backup_dir until it is sent, so the
// plugin has it make a pass then (retention.HeldForBackup). Set it before
// Run.
func (k *Keeper) OnSent(fn func()) { k.onSent = fn }

// Run makes a pass at once, every period and at each Kick (kicks within
// retention.KickGap of a pass share the next one), and again at once while
// a pass that sent something leaves archives for the next (one whose sends
// all failed waits for the period), until ctx is done. After a pass that
// sent, it calls the function OnSent set.
func (k *Keeper) Run(ctx context.Context, period time.Duration) {
	cfg := loop.Config{Name: "backup", Log: k.log, First: loop.After(0), Kick: k.kick, Gap: retention.KickGap}
	loop.Run(ctx, cfg, func(ctx context.Context, _ loop.Wake) loop.Next {
		sent, more, err := k.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			k.log.Error("backup pass incomplete", "error", err)
		}
		if len(sent) > 0 && k.onSent != nil {
			k.onSent()
		}
		if more && len(sent) > 0 {
			return loop.After(0)
		}
		return loop.After(period)
	})
}

// Pass sends, oldest first, up to BatchSize archives of the configured
// classes that are not in backup_dir yet (oldest first: a manifest's
// creation orders an identity's backups, List): a snapshot of each, sent whole
// the first time, and incrementally from the identity's previous backup
// when that snapshot is still on the archive and its stream in backup_dir.
// An archive is then marked (retention.PropBackup) so that it is sent
// once. more says that archives are left for the next pass.
func (k *Keeper) Pass(ctx context.Context) (sent []Manifest, more bool, err error) {
	k.releasesWaiting.Add(1)
	k.passMu.Lock()
	k.releasesWaiting.Add(-1)
	defer k.passMu.Unlock()
	cfg, node := k.config()
	if cfg.Dir == "" || len(cfg.Classes) == 0 {
		return nil, false, nil
	}
	_, archives, _, err := retention.Read(ctx, k.zfs, cfg.Container)
	if err != nil {
		return nil, false, err
	}
	var todo []retention.Archive
	for i := len(archives) - 1; i >= 0; i-- { // oldest first
		a := archives[i]
		if cfg.Classes[a.Class] && a.Backup == "" && !a.Identity.Unknown && a.Identity.Index >= 0 {
			todo = append(todo, a)
		}
	}
	if len(todo) > BatchSize {
		todo, more = todo[:BatchSize], true
	}
	var errs []error
	for _, a := range todo {
		m, err := k.send(ctx, cfg, node, a, nil)
		if errors.Is(err, zfs.ErrNotExist) && k.gone(ctx, a.Name) {
			// Renamed or destroyed since the read: a restore took it back
			// into a slot (its next release is backed up), or retention
			// pruned it. Not a failure of the backup.
			k.log.Debug("an archive left before its backup ended", "dataset", a.Name, "error", err)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("backing up %s: %w", a.Name, err))
			continue
		}
		sent = append(sent, m)
		kind := "full"
		if m.BaseGUID != 0 {
			kind = "incremental"
		}
		k.log.Info("archive backed up", "dataset", a.Name, "identity", a.Identity.String(), "stream", m.StreamPath(), "bytes", m.Size, "kind", kind)
	}
	k.releasePending(ctx)
	if err := k.sweep(ctx, cfg.Container, archives, sent); err != nil {
		errs = append(errs, err)
	}
	if err := k.sweepSlots(ctx, cfg); err != nil {
		errs = append(errs, err)
	}
	if time.Since(k.scanned) >= PruneScanPeriod {
		if err := k.prune(cfg, nil); err != nil {
			errs = append(errs, err)
		} else {
			k.scanned = time.Now()
		}
	} else {
		for _, m := range sent {
			if err := k.prune(cfg, &m.Identity); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return sent, more, errors.Join(errs...)
}

// prune deletes the chains of streams in backup_dir that retention lets
// go (PlanPrune), of identity only (nil: of every identity of the
// configured classes).
func (k *Keeper) prune(cfg Config, only *retention.Identity) error {
	ms, problems, err := List(cfg.Dir, only)
	if err != nil {
		return fmt.Errorf("pruning backup_dir: %w", err)
	}
	k.summaries.note(cfg, only, ms)
	// An identity whose directory holds a manifest that does not parse
	// (damaged, or a newer version's) is not pruned: what that manifest
	// needs cannot be known.
	unsure := map[string]bool{}
	for _, p := range problems {
		unsure[filepath.Dir(p.Path)] = true
	}
	byID := map[retention.Identity][]Manifest{}
	var ids []retention.Identity
	for _, m := range ms {
		if !cfg.Classes[m.Identity.Class] || m.Identity.Unknown || unsure[filepath.Dir(m.Path())] {
			continue
		}
		if _, seen := byID[m.Identity]; !seen {
			ids = append(ids, m.Identity)
		}
		byID[m.Identity] = append(byID[m.Identity], m) // newest first, as List
	}
	var errs []error
	now := time.Now()
	grace := cfg.PruneGrace
	if grace <= 0 {
		grace = PruneGrace
	}
	if only == nil {
		errs = append(errs, k.collectLeftovers(byID, ids, now, grace))
	}
	for _, id := range ids {
		p, ok := cfg.Rules.Classes[id.Class]
		if !ok {
			p = cfg.Rules.Default
		}
		if p.Keep <= 0 {
			p.Keep = retention.DefaultKeep
		}
		left := byID[id]
		if mine := notSetAside(left); len(mine) > 0 {
			if err := forkAt(id, mine, mine[0], retention.Archive{}); err != nil {
				k.log.Warn("backup_dir keeps every stream of an identity whose data forked", "identity", id.String(), "error", err)
			}
		}
		for _, c := range PlanPrune(byID[id], p, now, grace, StreamPresent) {
			gone := map[uint64]bool{}
			var bytes int64
			for _, m := range c.Streams {
				gone[m.GUID] = true
				bytes += m.Size
			}
			left = slices.DeleteFunc(left, func(m Manifest) bool { return gone[m.GUID] })
			if err := deleteChain(c, left); err != nil {
				errs = append(errs, fmt.Errorf("pruning a backup chain of %s: %w", id, err))
				continue
			}
			k.summaries.pruned(id, c)
			k.log.Info("backup chain pruned", "identity", id.String(), "rule", c.Rule, "streams", len(c.Streams), "bytes", bytes)
		}
	}
	return errors.Join(errs...)
}

// collectLeftovers removes, from the directories of identities ids (their
// manifests byID), what crashes left there (leftovers).
func (k *Keeper) collectLeftovers(byID map[retention.Identity][]Manifest, ids []retention.Identity, now time.Time, grace time.Duration) error {
	var errs []error
	for _, id := range ids {
		ms := byID[id]
		dir := filepath.Dir(ms[0].Path())
		files, err := leftovers(dir, ms, now, grace)
		if err != nil {
			errs = append(errs, fmt.Errorf("collecting leftovers of %s: %w", id, err))
			continue
		}
		for _, f := range files {
			if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
			k.log.Info("a file a crash left in backup_dir removed", "identity", id.String(), "file", f)
		}
	}
	return errors.Join(errs...)
}

// send backs up one archive (see Pass), or, with live, one dataset in use
// (see LivePass) as the pass read it: a.ReleasedAt is then the time the
// snapshot is taken, and the dataset is not marked (its final state is
// sent once it is archived).
func (k *Keeper) send(ctx context.Context, cfg Config, node string, a retention.Archive, live *liveRead) (Manifest, error) {
	dir := cfg.Dir
	have, _, err := List(dir, &a.Identity)
	if err != nil {
		return Manifest{}, err
	}
	inDir := map[uint64]bool{}
	for _, m := range have {
		inDir[m.GUID] = true
	}
	var snaps []zfs.Snap
	if live != nil && live.snapsRead {
		snaps = live.snaps
	} else if snaps, err = k.zfs.Snapshots(ctx, a.Name); err != nil {
		return Manifest{}, err
	}
	// The newest of the plugin's snapshots that backup_dir holds is the
	// base; a newer one of the plugin's taken of the archive (an earlier
	// pass that stopped before its manifest) is sent rather than a new one
	// taken. A live one (LiveSnapshotPrefix: a live backup that did not
	// finish) misses what the task wrote after it: never sent as the
	// archive's; nor is one taken before this release (takenSince: a
	// failed send of an earlier tenant's archive, which a restore brought
	// back with the dataset). A live backup always takes a new one.
	now := time.Now().UTC()
	if live != nil {
		a.ReleasedAt = now
	}
	base, snap := zfs.Snap{}, zfs.Snap{}
	for _, s := range snaps {
		if !strings.HasPrefix(s.Name, a.Name+"@"+SnapshotPrefix) {
			continue
		}
		switch {
		case inDir[s.GUID]:
			base, snap = s, zfs.Snap{}
		case live == nil && !strings.HasPrefix(s.Name, a.Name+"@"+LiveSnapshotPrefix) && takenSince(s.Name, a.ReleasedAt):
			snap = s
		}
	}
	var baseManifest Manifest
	if base.Name != "" {
		// A long chain, or one whose increments weigh as much as its full
		// stream, restarts from a full stream, so that retention can
		// delete the older chain whole.
		for _, m := range have {
			if m.GUID == base.GUID {
				baseManifest = m
				break
			}
		}
		if chain, err := chainOf(have, baseManifest); err != nil || restartChain(chain, cfg.FullEvery) {
			base = zfs.Snap{}
		}
	}
	if snap.Name == "" {
		prefix := SnapshotPrefix
		var before uint64
		if live != nil {
			prefix = LiveSnapshotPrefix
			// The name may serve another dataset since the pass read it
			// (released, its spare made, even handed to another tenant):
			// the dataset after the snapshot must be the one the pass
			// read in use by a's allocation (inUseAs), or read so now
			// when the pass's read had no GUID.
			if before = live.guid; before == 0 {
				if before, err = k.inUseAs(ctx, a); err != nil {
					return Manifest{}, err
				}
			}
		}
		snap.Name = a.Name + "@" + prefix + now.Format(snapTimeFormat)
		if err := k.zfs.Snapshot(ctx, snap.Name); err != nil {
			return Manifest{}, err
		}
		if live != nil {
			if after, err := k.inUseAs(ctx, a); err != nil || after != before {
				if derr := k.zfs.DestroySnapshot(context.WithoutCancel(ctx), snap.Name); derr != nil {
					k.log.Warn("a live snapshot of a dataset that changed hands could not be destroyed", "snapshot", snap.Name, "error", derr)
				}
				if err == nil {
					err = fmt.Errorf("%s: another dataset took the name during its live backup: %w", a.Name, ErrChangedHands)
				}
				return Manifest{}, err
			}
		}
		if snap.GUID, err = k.zfs.SnapshotGUID(ctx, snap.Name); err != nil {
			return Manifest{}, err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, SendTimeout)
	defer cancel()
	m := Manifest{Identity: a.Identity, AllocID: a.AllocID, Node: node, Dataset: a.Name, Slot: a.Slot,
		Snapshot: strings.SplitN(snap.Name, "@", 2)[1], GUID: snap.GUID, BaseGUID: base.GUID, ReleasedAt: a.ReleasedAt,
		KeyID: a.KeyID, Live: live != nil, From: a.From}
	keySaved := false
	if a.KeyID != "" {
		if keySaved, err = saveKey(cfg.KeyDir, dir, a.Identity, a.KeyID); err != nil {
			return m, fmt.Errorf("saving its key: %w", err)
		}
	}
	m, err = Write(sctx, k.zfs, dir, snap.Name, base.Name, m)
	if err == nil && base.Name != "" {
		// Retention on another node may have pruned the base's chain
		// while this increment was sent (it waits PruneGrace, longer than
		// a send, but clocks differ): an increment whose base is gone
		// restores nothing, so it goes, and the next pass sends whole.
		if _, serr := os.Stat(baseManifest.Path()); serr != nil {
			os.Remove(m.Path())
			os.Remove(m.StreamPath())
			err = fmt.Errorf("the base of this increment (%s) left backup_dir while it was sent; the next pass sends the archive whole: %w", baseManifest.Path(), serr)
		}
	}
	if err != nil {
		if keySaved { // no stream of it made it: its key goes too
			if rerr := record.RemoveKey(IdentityDir(dir, a.Identity), a.KeyID); rerr != nil {
				k.log.Warn("the key saved for a failed send could not be removed", "key_id", a.KeyID, "error", rerr)
			}
		}
		return m, err
	}
	if live == nil {
		if err := k.zfs.Set(ctx, a.Name, retention.PropBackup, strconv.FormatUint(m.GUID, 10)); err != nil {
			return m, err
		}
	}
	// The snapshots read before the send are all the keeper's older ones
	// (passes are serialised): no second read. They go once the pass has
	// sent what it sends (releasePending), so that a slow destroy never
	// holds up another dataset's backup.
	k.pending = append(k.pending, pendingRelease{snaps: snaps, dataset: a.Name, keep: snap.Name})
	return m, nil
}

// gone reports whether dataset name is known not to exist any more.
func (k *Keeper) gone(ctx context.Context, name string) bool {
	ok, err := k.exists(ctx, name)
	return err == nil && !ok
}

// exists reports whether dataset name exists; an error when ZFS cannot
// say.
func (k *Keeper) exists(ctx context.Context, name string) (bool, error) {
	_, err := k.zfs.Get(ctx, name, 0, "used")
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, zfs.ErrNotExist):
		return false, nil
	}
	return false, err
}
