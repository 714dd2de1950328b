package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

const archivesHelp = `Usage: nomad-device-zfs archives [options]

  Lists the datasets the plugin archived on this node (<parent>/.archive),
  newest first: the identity they belong to (namespace/job/group[index]/task
  and class), the slot they came from, when they were released, their size
  and where they are (local, also in backup_dir, or, for an identity this
  node has no archive of, only in backup_dir: the newest backup, which a
  restore here would receive). With -config, the PRUNE column says which retention
  rule (keep, max_age, archive_quota) would delete an archive at the next
  pass. Datasets in the archive that retention leaves alone are listed with
  why. It reads ZFS and changes nothing.
` + commonHelp

const pruneHelp = `Usage: nomad-device-zfs prune -dry-run [options]
       nomad-device-zfs prune [options]

  Applies the classes' retention (keep, max_age) and archive_quota to the
  archive, as the plugin does in the background after every release and
  every minute. With -dry-run it only says what it would delete and why.
  Without it, it deletes, in batches, until nothing more is due. Needs
  -config: the rules are in the agent's configuration.

  -dry-run
    Print what would be deleted and why; delete nothing.
` + commonHelp

// archivesReport is what `archives` and `prune` show; -json prints it.
type archivesReport struct {
	Archive    string `json:"archive"`
	Exists     bool   `json:"exists"`
	UsedBytes  uint64 `json:"used_bytes"`
	QuotaBytes uint64 `json:"quota_bytes,omitempty"`
	// RulesKnown: the retention rules came from -config, so Prune says
	// what the next pass deletes.
	RulesKnown bool                `json:"rules_known"`
	Archives   []archiveRow        `json:"archives"`
	Skipped    []retention.Skipped `json:"skipped,omitempty"`
	// Deleted lists what `prune` deleted (without -dry-run).
	Deleted []string `json:"deleted,omitempty"`
	DryRun  bool     `json:"dry_run,omitempty"`
}

type archiveRow struct {
	retention.Archive
	// Where the archive is: "local" (a dataset in this node's archive),
	// "local, backup_dir" (also in backup_dir), or "backup_dir" (only
	// there: the newest backup of an identity this node has no archive of;
	// Name is then its stream file).
	Where string `json:"where"`
	// Prune is set when the rules delete it at the next pass.
	Prune *pruneWhy `json:"prune,omitempty"`
}

type pruneWhy struct {
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
}

// gatherArchives reads the archive (one zfs get) and, when the rules are
// known, plans the next retention pass.
func gatherArchives(ctx context.Context, z retention.Reader, c *common, now time.Time) (archivesReport, error) {
	container := c.settings.Slots.ArchiveDataset()
	ct, archives, skipped, err := retention.Read(ctx, z, container)
	if err != nil {
		return archivesReport{}, err
	}
	r := archivesReport{Archive: container, Exists: ct.Exists, UsedBytes: ct.UsedBytes, QuotaBytes: ct.QuotaBytes,
		RulesKnown: !c.fromZFS, Skipped: skipped, Archives: []archiveRow{}}
	why := map[string]*pruneWhy{}
	if r.RulesKnown {
		for _, p := range retention.Plan(archives, ct.UsedBytes, c.settings.Retention, now) {
			why[p.Archive.Name] = &pruneWhy{Rule: p.Rule, Reason: p.Reason}
		}
	}
	backedUp := map[string]bool{} // snapshot GUIDs in backup_dir
	var remote []archiveRow
	if dir := c.settings.BackupDir; dir != "" {
		ms, _, err := backup.List(dir, nil)
		if err != nil {
			return r, err
		}
		for _, m := range ms {
			backedUp[strconv.FormatUint(m.GUID, 10)] = true
		}
		local := map[retention.Identity]bool{}
		for _, a := range archives {
			local[a.Identity] = true
		}
		newest := map[retention.Identity]bool{}
		for _, m := range ms { // newest first
			if local[m.Identity] || newest[m.Identity] {
				continue
			}
			newest[m.Identity] = true
			remote = append(remote, archiveRow{Where: "backup_dir", Archive: retention.Archive{
				Name: m.StreamPath(), Class: m.Identity.Class, Slot: m.Slot, AllocID: m.AllocID,
				Identity: m.Identity, ReleasedAt: m.ReleasedAt, UsedBytes: uint64(m.Size)}})
		}
	}
	for _, a := range archives {
		where := "local"
		if backedUp[a.Backup] {
			where = "local, backup_dir"
		}
		r.Archives = append(r.Archives, archiveRow{Archive: a, Where: where, Prune: why[a.Name]})
	}
	r.Archives = append(r.Archives, remote...)
	return r, nil
}

// renderArchives writes the archives table and what was skipped.
func renderArchives(w io.Writer, r archivesReport, now time.Time) error {
	if !r.Exists {
		_, err := fmt.Fprintf(w, "No archive yet: %s does not exist (the plugin makes it with its first slots).\n", r.Archive)
		return err
	}
	quota := "no quota"
	if r.QuotaBytes > 0 {
		quota = "quota " + bytesIEC(r.QuotaBytes)
	}
	if _, err := fmt.Fprintf(w, "Archive %s: %s, %s used, %s\n\n", r.Archive, plural(len(r.Archives), "archive"), bytesIEC(r.UsedBytes), quota); err != nil {
		return err
	}
	if len(r.Archives) > 0 {
		rows := [][]string{{"IDENTITY", "SLOT", "RELEASED", "AGE", "USED", "WHERE", "PRUNE", "DATASET"}}
		for _, a := range r.Archives {
			prune := "-"
			if !r.RulesKnown {
				prune = "?"
			} else if a.Prune != nil {
				prune = a.Prune.Rule
			}
			rows = append(rows, []string{oneLine(a.Identity.String()), fmt.Sprintf("%s-%d", a.Class, a.Slot),
				a.ReleasedAt.UTC().Format(time.RFC3339), age(now.Sub(a.ReleasedAt)), bytesIEC(a.UsedBytes), a.Where, prune, a.Name})
		}
		if err := table(w, rows); err != nil {
			return err
		}
	}
	if !r.RulesKnown && len(r.Archives) > 0 {
		if _, err := fmt.Fprintln(w, "\nPRUNE is ? without -config: the retention rules are in the agent's configuration."); err != nil {
			return err
		}
	}
	for _, a := range r.Archives {
		if a.Prune != nil {
			if _, err := fmt.Fprintf(w, "\n%s: %s", a.Name, oneLine(a.Prune.Reason)); err != nil {
				return err
			}
		}
	}
	if len(r.Skipped) > 0 {
		if _, err := fmt.Fprintf(w, "\n\nLeft alone by retention:\n"); err != nil {
			return err
		}
		for _, s := range r.Skipped {
			if _, err := fmt.Fprintf(w, "  %s: %s\n", s.Name, oneLine(s.Reason)); err != nil {
				return err
			}
		}
		return nil
	}
	_, err := fmt.Fprintln(w)
	return err
}

// renderPrune writes what prune did or would do.
func renderPrune(w io.Writer, r archivesReport) error {
	var planned []archiveRow
	for _, a := range r.Archives {
		if a.Prune != nil {
			planned = append(planned, a)
		}
	}
	switch {
	case r.DryRun && len(planned) == 0:
		_, err := fmt.Fprintf(w, "Nothing to prune in %s (%s kept).\n", r.Archive, plural(len(r.Archives), "archive"))
		return err
	case r.DryRun:
		if _, err := fmt.Fprintf(w, "Would delete %s of %d in %s:\n", plural(len(planned), "archive"), len(r.Archives), r.Archive); err != nil {
			return err
		}
		for _, a := range planned {
			if _, err := fmt.Fprintf(w, "  %s  %s  %s: %s\n", a.Name, bytesIEC(a.UsedBytes), a.Prune.Rule, oneLine(a.Prune.Reason)); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := fmt.Fprintf(w, "Deleted %s from %s.\n", plural(len(r.Deleted), "archive"), r.Archive); err != nil {
		return err
	}
	for _, n := range r.Deleted {
		if _, err := fmt.Fprintf(w, "  %s\n", n); err != nil {
			return err
		}
	}
	return nil
}

// errPruneNeedsConfig: prune without -config.
var errPruneNeedsConfig = errors.New("prune needs -config: the retention rules (keep, max_age, archive_quota) are in the agent's configuration")

// runPrune plans (dry run) or applies the retention rules, pass after
// pass, until nothing more is due or ctx ends.
func runPrune(ctx context.Context, c *common, z retention.ZFS, dryRun bool, log hclog.Logger) (archivesReport, error) {
	if c.fromZFS {
		return archivesReport{}, errPruneNeedsConfig
	}
	r, err := gatherArchives(ctx, z, c, time.Now())
	r.DryRun = dryRun
	if err != nil || dryRun {
		return r, err
	}
	p := retention.New(z, log)
	p.SetConfig(retention.Config{Container: r.Archive, Rules: c.settings.Retention})
	for {
		res, err := p.Pass(ctx)
		r.Deleted = append(r.Deleted, res.Destroyed...)
		if err != nil || !res.More {
			return r, err
		}
	}
}

// age prints a duration the way an operator reads an archive's age:
// "45s", "12m", "5h", "3d".
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
