package periodic

// The archive: sampled during the churn, waited for until the plugin has
// settled, then counted per parent job against keep.

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

const (
	// settleTimeout bounds the wait, after the last run ended, for the
	// plugin to settle.
	settleTimeout = 5 * time.Minute
	// settleQuiet is how long the archive must stay as it is, every
	// slot free and every archive in backup_dir, before the plugin counts
	// as settled: longer than retention waits to serve a kick after a
	// pass that found nothing to prune (retention.IdleKickGap), so that
	// the pass a last release asked for has run, with a backup pass
	// (retention.KickGap) on either side. At 10 s, shorter than that
	// wait, a run could count the archive before its prune: one parent
	// over keep by one, a bound broken that was not (CI, 2026-12-07).
	settleQuiet = retention.IdleKickGap + 2*retention.KickGap
)

// ArchiveFigures is the archive as the plugin left it.
type ArchiveFigures struct {
	Archives []ArchiveRecord `json:"archives"`
	// PerParent counts the archives of each parent job; Max is the most.
	PerParent map[string]int `json:"per_parent"`
	Max       int            `json:"max_per_parent"`
	// Peak is the most archives of one parent in a sample taken during
	// the churn (every few seconds), Samples how many were taken:
	// between a release and the retention pass after it a parent may
	// hold one more than keep, and more while runs of it overlap.
	Peak    int `json:"peak_per_parent_during_churn"`
	Samples int `json:"samples"`
	// Bytes is what the archives use (ZFS's used, their snapshots
	// included); ContainerBytes what the archive container uses.
	Bytes          uint64 `json:"bytes"`
	ContainerBytes uint64 `json:"container_bytes"`
	// Snapshots is the most of the keeper's snapshots on one archive:
	// it keeps one, the base of the next increment (configuration.md,
	// backup_dir); more are left behind by destroys that failed.
	Snapshots int `json:"most_keeper_snapshots_per_archive"`
}

// ArchiveRecord is one archive at the end.
type ArchiveRecord struct {
	Name string `json:"name"`
	Job  string `json:"job"` // the run's job, as the plugin recorded its owner
	// Parent is the parent job read from Job's name; RecordedParent the
	// one the plugin recorded with the owner, IdentityJob the job its
	// retention counts it under.
	Parent         string `json:"parent"`
	RecordedParent string `json:"recorded_parent"`
	IdentityJob    string `json:"identity_job"`
	UsedBytes      uint64 `json:"used_bytes"`
	Backup         string `json:"backup,omitempty"` // its snapshot's GUID in backup_dir
	// Snapshots are the keeper's snapshots on it.
	Snapshots int `json:"keeper_snapshots"`
}

// perParent counts archives of the class by the parent job their run's
// name says: the plugin's own identity is not what is checked.
func perParent(archives []retention.Archive) map[string]int {
	n := map[string]int{}
	for _, a := range archives {
		if a.Class == class {
			n[parentOf(a.Owner.Job)]++
		}
	}
	return n
}

func maxOf(m map[string]int) int {
	top := 0
	for _, v := range m {
		top = max(top, v)
	}
	return top
}

// sampleArchive records the most archives of one parent now; a read that
// fails is skipped (the end is what is judged).
func (r *periodicRun) sampleArchive(ctx context.Context) {
	_, archives, _, err := retention.Read(ctx, r.client, r.container())
	if err != nil {
		return
	}
	r.res.Archive.Samples++
	r.res.Archive.Peak = max(r.res.Archive.Peak, maxOf(perParent(archives)))
}

// settled says what still keeps the plugin from having settled: slots not
// free, archives not in backup_dir yet, datasets of the archive that are
// not finished archives. key sums up the archive, to tell a change.
func (r *periodicRun) settled(ctx context.Context) (waiting []string, key string, err error) {
	ds, err := r.client.Get(ctx, r.classDataset(), 1, record.PropState, record.PropOwner)
	if err != nil {
		return nil, "", err
	}
	for _, d := range ds {
		if d.Name == r.classDataset() {
			continue
		}
		stored, _ := d.Local(record.PropState)
		owner, _ := d.Local(record.PropOwner)
		if st := record.StateOf(stored, owner); st != record.StateFree {
			waiting = append(waiting, fmt.Sprintf("slot dataset %s is %s", d.Name, st))
		}
	}
	_, archives, skipped, err := retention.Read(ctx, r.client, r.container())
	if err != nil {
		return nil, "", err
	}
	var b strings.Builder
	for _, a := range archives {
		fmt.Fprintf(&b, "%s=%s;", a.Name, a.Backup)
		if a.Backup == "" {
			waiting = append(waiting, fmt.Sprintf("archive %s is not in backup_dir", a.Name))
		}
	}
	for _, s := range skipped {
		waiting = append(waiting, fmt.Sprintf("%s: %s", s.Name, s.Reason))
	}
	return waiting, b.String(), nil
}

// settle returns once the plugin has settled after the churn: every slot
// free, every archive in backup_dir, and the archive unchanged for
// settleQuiet (retention has run after the last release).
func (r *periodicRun) settle(ctx context.Context) error {
	start := time.Now()
	deadline := start.Add(settleTimeout)
	var last string
	var since time.Time
	for {
		waiting, key, err := r.settled(ctx)
		switch {
		case err != nil || len(waiting) > 0:
			last = ""
		case key != last:
			last, since = key, time.Now()
		case time.Since(since) >= settleQuiet:
			r.res.SettleSeconds = time.Since(start).Seconds()
			r.logf("settled %.1f s after the last run ended", r.res.SettleSeconds)
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil && len(waiting) == 0 {
				err = fmt.Errorf("the archive still changes")
			} else if err == nil {
				err = fmt.Errorf("%s", strings.Join(waiting, "; "))
			}
			return fmt.Errorf("the plugin has not settled %s after the last run ended: %w (agent log %s)", settleTimeout, err, r.a.LogPath)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// measureArchive counts the archives per parent job against keep, and
// checks that each was recorded with its run's parent job.
func (r *periodicRun) measureArchive(ctx context.Context) error {
	c, archives, _, err := retention.Read(ctx, r.client, r.container())
	if err != nil {
		return err
	}
	f := &r.res.Archive
	f.ContainerBytes = c.UsedBytes
	for _, a := range archives {
		rec := ArchiveRecord{Name: a.Name, Job: a.Owner.Job, Parent: parentOf(a.Owner.Job), RecordedParent: a.Owner.Parent,
			IdentityJob: a.Identity.Job, UsedBytes: a.UsedBytes, Backup: a.Backup}
		snaps, err := r.client.Snapshots(ctx, a.Name)
		if err != nil {
			return err
		}
		for _, s := range snaps {
			if strings.HasPrefix(s.Name, a.Name+"@"+backup.SnapshotPrefix) {
				rec.Snapshots++
			}
		}
		f.Snapshots = max(f.Snapshots, rec.Snapshots)
		f.Archives = append(f.Archives, rec)
		f.Bytes += a.UsedBytes
		if a.Class != class || rec.Parent == "" {
			r.violate("archive %s is not of a run of the periodic jobs (class %q, job %q)", a.Name, a.Class, a.Owner.Job)
			continue
		}
		if rec.RecordedParent != rec.Parent || rec.IdentityJob != rec.Parent {
			r.violate("archive %s of run %s: recorded parent %q, identity job %q, want %q", a.Name, rec.Job, rec.RecordedParent, rec.IdentityJob, rec.Parent)
		}
	}
	sort.Slice(f.Archives, func(i, j int) bool { return f.Archives[i].Name < f.Archives[j].Name })
	f.PerParent = perParent(archives)
	f.Max = maxOf(f.PerParent)
	for p, n := range f.PerParent {
		if n > r.o.Keep {
			r.violate("parent job %s keeps %d archives, more than keep = %d", p, n, r.o.Keep)
		}
	}
	for i := range r.o.Parents {
		if f.PerParent[parentID(i)] == 0 {
			r.violate("parent job %s has no archive: its last run's data is gone", parentID(i))
		}
	}
	r.logf("archive: %d archives, %.1f MiB; at most %d of one parent (keep = %d; %d at most in %d samples during the churn); at most %d of the keeper's snapshots on one",
		len(archives), mib(f.Bytes), f.Max, r.o.Keep, f.Peak, f.Samples, f.Snapshots)
	return nil
}

func mib[T int64 | uint64](b T) float64 { return float64(b) / (1 << 20) }
