package retention

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// BatchSize bounds the archives one pass destroys; the next pass follows at
// once when more are due, so a long backlog never holds a pass for long.
const BatchSize = 16

// Reader is what Read needs from ZFS. *zfs.Client implements it.
type Reader interface {
	Get(ctx context.Context, name string, depth int, props ...string) ([]zfs.Dataset, error)
}

// ZFS is what the pruner needs from ZFS. *zfs.Client implements it.
type ZFS interface {
	Reader
	DestroyRecursive(ctx context.Context, name, within string) error
	SetMany(ctx context.Context, name string, props map[string]string) error
}

// Config is what the pruner works to.
type Config struct {
	// Container is the archive container, <parent>/.archive.
	Container string
	Rules     Rules
	// KeyDir holds the keys of encrypted archives ("" for none).
	KeyDir string
}

// Read reads the archive container and its children with one `zfs get`
// and sorts them (Parse). A container that does not exist yet reads as
// empty (Exists false), not as an error.
func Read(ctx context.Context, z Reader, container string) (Container, []Archive, []Skipped, error) {
	ds, err := z.Get(ctx, container, 1, Props...)
	if errors.Is(err, zfs.ErrNotExist) {
		return Container{Name: container}, nil, nil, nil
	}
	if err != nil {
		return Container{Name: container}, nil, nil, fmt.Errorf("reading the archive %s: %w", container, err)
	}
	c, a, s := Parse(container, ds)
	return c, a, s, nil
}

// Result is what one pass did.
type Result struct {
	// Planned is every prune the rules call for, oldest first; Destroyed
	// the names of those this pass destroyed (at most BatchSize).
	Planned   []Prune
	Destroyed []string
	// More: prunes are left for the next pass.
	More bool
}

// Pruner applies the retention rules in the background. Its methods are
// safe for concurrent use.
type Pruner struct {
	zfs  ZFS
	log  hclog.Logger
	kick chan struct{}

	// passMu serialises passes: Run's and those of tests.
	passMu sync.Mutex

	// mu guards cfg, set, held and inflight.
	mu  sync.Mutex
	cfg Config
	set bool
	// held counts, by archive name, the restores that claimed an archive
	// (Claim): a pass never destroys one. inflight is the archive a pass
	// is destroying, which Claim never hands out.
	held     map[string]int
	inflight string
	// seen, when set, is told after each pass what the archive keeps.
	seen func([]Archive)
	// idle: the last pass found nothing to prune, nor anything held
	// back only until the keeper sends it (HeldForBackup), under rules
	// with no archive_quota (Run then serves kicks IdleKickGap apart); gen counts
	// SetConfig calls, so that a pass under an older config leaves idle
	// as SetConfig cleared it.
	idle bool
	gen  uint64
}

// OnPass sets a function that is told, after each pass, the archives the
// archive container still holds (nil for none). It is called on Run's
// goroutine with no lock held. Set it before Run.
func (p *Pruner) OnPass(fn func([]Archive)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = fn
}

// New returns a pruner that reaches ZFS through z. It does nothing until
// SetConfig.
func New(z ZFS, log hclog.Logger) *Pruner {
	return &Pruner{zfs: z, log: log, kick: make(chan struct{}, 1), held: map[string]int{}}
}

// SetConfig replaces the configuration; the next pass works to it.
func (p *Pruner) SetConfig(cfg Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg, p.set, p.idle = cfg, true, false
	p.gen++
}

// Kick asks Run for a pass now, or KickGap after the last one began (after
// a release added an archive). It never blocks.
func (p *Pruner) Kick() { loop.Kick(p.kick) }

// Run makes a pass at once, then every period, at each Kick (no sooner
// than KickGap after the last pass began, or IdleKickGap while the passes
// find nothing to prune), and again at once while a pass leaves prunes for
// the next; it returns when ctx is done. A failed pass is logged and tried
// again at the next.
func (p *Pruner) Run(ctx context.Context, period time.Duration) {
	cfg := loop.Config{Name: "retention", Log: p.log, First: loop.After(0), Kick: p.kick, Gap: KickGap}
	var began time.Time // when the last pass began
	loop.Run(ctx, cfg, func(ctx context.Context, w loop.Wake) loop.Next {
		p.mu.Lock()
		idle := p.idle
		p.mu.Unlock()
		if wait := time.Until(began.Add(IdleKickGap)); idle && !w.Timer && wait > 0 {
			return loop.After(wait) // the kicks meanwhile are served then
		}
		began = time.Now()
		res, err := p.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			p.log.Error("retention pass incomplete", "error", err)
		}
		if err != nil {
			p.mu.Lock()
			p.idle = false // a pass that failed is tried again at the next kick
			p.mu.Unlock()
		}
		if res.More && err == nil {
			return loop.After(0)
		}
		return loop.After(period)
	})
}

// IdleKickGap is the gap of the retention passes that kicks ask for while
// the last pass found nothing to prune and no archive_quota is set (a
// quota is kept at KickGap: the archive's room is at stake). Each pass
// reads every archive (one `zfs get` that lists them all), and under a
// churn of short jobs of many identities, each of whose archives is
// within its keep, a pass every KickGap read the whole archive for
// nothing (issue 46). A prune the rules call for then waits IdleKickGap
// at most; once a pass finds one, kicks are served KickGap apart again. A
// pass that finds a prune held back until the keeper sends the archive is
// not idle: the keeper kicks retention once it has sent (backup.Keeper's
// OnSent), and that pass comes KickGap after the last. While backup_dir
// cannot be written and such a prune waits, every release's kick is served
// KickGap apart, as before issue 46, for as long as the keeper fails.
const IdleKickGap = 30 * time.Second

// KickGap is the gap of the archive's passes (retention, backups): under a
// churn of short jobs every release kicks them, and the kicks that come
// within KickGap of a pass are served by one pass at its end, so that the
// archive is read once for many releases rather than once per release.
const KickGap = 2 * time.Second

// Pass reads the archive once, destroys up to BatchSize of the archives
// the rules prune (oldest first), then brings the container's quota to
// archive_quota. On return every destroy it attempted is done or in the
// error; nothing outside the container was touched.
func (p *Pruner) Pass(ctx context.Context) (Result, error) {
	p.passMu.Lock()
	defer p.passMu.Unlock()
	p.mu.Lock()
	cfg, set, gen := p.cfg, p.set, p.gen
	p.mu.Unlock()
	if !set || cfg.Container == "" {
		return Result{}, nil
	}
	c, archives, _, err := Read(ctx, p.zfs, cfg.Container)
	if err != nil || !c.Exists {
		return Result{}, err
	}
	now := time.Now()
	res := Result{Planned: Plan(archives, c.UsedBytes, cfg.Rules, now)}
	batch := res.Planned
	if len(batch) > BatchSize {
		batch, res.More = batch[:BatchSize], true
	}
	var errs []error
	used := c.UsedBytes
	for _, pr := range batch {
		if ctx.Err() != nil {
			return res, errors.Join(append(errs, ctx.Err())...)
		}
		if !p.startDestroy(pr.Archive.Name) {
			p.log.Debug("archive claimed by a restore; not pruned", "dataset", pr.Archive.Name)
			continue
		}
		err := p.zfs.DestroyRecursive(ctx, pr.Archive.Name, cfg.Container)
		p.endDestroy()
		if err != nil && !errors.Is(err, zfs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("pruning %s: %w", pr.Archive.Name, err))
			continue
		}
		if pr.Archive.KeyID != "" && cfg.KeyDir != "" {
			if err := record.RemoveKey(cfg.KeyDir, pr.Archive.KeyID); err != nil {
				errs = append(errs, fmt.Errorf("pruned %s, its key not removed: %w", pr.Archive.Name, err))
			}
		}
		used = sub(used, pr.Archive.UsedBytes)
		res.Destroyed = append(res.Destroyed, pr.Archive.Name)
		p.log.Info("pruned archive", "dataset", pr.Archive.Name, "identity", pr.Archive.Identity.String(),
			"rule", pr.Rule, "reason", pr.Reason)
	}
	if err := p.applyQuota(ctx, c, used, cfg.Rules.Quota); err != nil {
		errs = append(errs, err)
	}
	// Not idle while a prune waits for the keeper's send: its kick
	// (OnSent) is then served KickGap apart, not IdleKickGap.
	idle := len(res.Planned) == 0 && cfg.Rules.Quota == 0 && len(errs) == 0 &&
		!HeldForBackup(archives, c.UsedBytes, cfg.Rules, now)
	p.mu.Lock()
	seen := p.seen
	if p.gen == gen {
		p.idle = idle
	}
	p.mu.Unlock()
	if seen != nil {
		gone := map[string]bool{}
		for _, n := range res.Destroyed {
			gone[n] = true
		}
		var kept []Archive
		for _, a := range archives {
			if !gone[a.Name] {
				kept = append(kept, a)
			}
		}
		seen(kept)
	}
	return res, errors.Join(errs...)
}

// applyQuota sets the container's quota to want (archive_quota) once what
// the archive uses fits under it, recording it in PropArchiveQuota; with no
// archive_quota it removes a quota only when it is the one the plugin set.
func (p *Pruner) applyQuota(ctx context.Context, c Container, used, want uint64) error {
	switch {
	case want > 0 && c.QuotaBytes != want:
		if used > want {
			p.log.Warn("archive_quota not applied yet: the archive uses more; retention prunes toward it",
				"archive", c.Name, "archive_quota", want, "used", used)
			return nil
		}
		v := strconv.FormatUint(want, 10)
		if err := p.zfs.SetMany(ctx, c.Name, map[string]string{PropArchiveQuota: v, "quota": v}); err != nil {
			return fmt.Errorf("setting archive_quota on %s: %w", c.Name, err)
		}
		p.log.Info("archive quota set", "archive", c.Name, "archive_quota", want)
	case want == 0 && c.QuotaMark > 0 && c.QuotaBytes == c.QuotaMark:
		if err := p.zfs.SetMany(ctx, c.Name, map[string]string{"quota": "none", PropArchiveQuota: "0"}); err != nil {
			return fmt.Errorf("removing the archive_quota the plugin set on %s: %w", c.Name, err)
		}
		p.log.Info("archive quota removed (archive_quota is no longer configured)", "archive", c.Name)
	}
	return nil
}

// startDestroy marks name as being destroyed unless a restore holds it; it
// reports whether the caller may destroy it.
func (p *Pruner) startDestroy(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[name] > 0 {
		return false
	}
	p.inflight = name
	return true
}

func (p *Pruner) endDestroy() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight = ""
}

// Claim returns the archives that hold the data of owner o's identity in
// class (namespace, job, group, task, allocation index): those of the
// identity's newest released allocation, in the order of the slots they
// came from, or none;
// and from, the lineage the data has once restored (record.PropDataFrom:
// that allocation, then its own lineage). Each is held against pruning
// until release is called; release must be called, also when names is
// empty. An owner whose allocation index is unknown matches nothing. It
// reads ZFS once. after (an allocation on another node whose data the
// caller waits for) is not looked for: nothing of another node arrives in
// this node's archive but from backup_dir, which the keeper reads
// (device.archiveSource).
func (p *Pruner) Claim(ctx context.Context, class string, o record.Owner, after record.Awaited) (names []string, from record.Lineage, release func(), err error) {
	names, newest, release, err := p.ClaimNewest(ctx, class, o)
	if len(names) > 0 {
		from = newest.Lineage()
	}
	return names, from, release, err
}

// ClaimNewest is Claim that returns the newest of the claimed archives
// (zero for none) instead of the lineage.
func (p *Pruner) ClaimNewest(ctx context.Context, class string, o record.Owner) (names []string, newest Archive, release func(), err error) {
	release = func() {}
	p.mu.Lock()
	container := p.cfg.Container
	p.mu.Unlock()
	if container == "" || !o.Known() || o.AllocIndex() < 0 || o.Truncated() {
		return nil, newest, release, nil
	}
	_, archives, _, err := Read(ctx, p.zfs, container)
	if err != nil {
		return nil, newest, release, err
	}
	want := IdentityOf(class, o) // as recorded
	var mine []Archive
	for _, a := range archives { // newest first
		if a.Identity != want {
			continue
		}
		if len(mine) > 0 && a.AllocID != mine[0].AllocID {
			break
		}
		mine = append(mine, a)
	}
	if len(mine) > 0 {
		newest = mine[0]
	}
	sort.SliceStable(mine, func(i, j int) bool { return mine[i].Slot < mine[j].Slot })
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range mine {
		if a.Name == p.inflight {
			continue // being pruned right now
		}
		p.held[a.Name]++
		names = append(names, a.Name)
	}
	held := append([]string(nil), names...)
	var once sync.Once
	return names, newest, func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, n := range held {
				if p.held[n]--; p.held[n] <= 0 {
					delete(p.held, n)
				}
			}
		})
	}, nil
}
