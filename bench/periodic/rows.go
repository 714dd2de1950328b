package periodic

// The periodic table: its rows, judged against the bounds, and the
// table printed.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
)

// Row is one figure of the periodic table.
type Row struct {
	Key      string `json:"key"`
	Figure   string `json:"figure"`
	Measured string `json:"measured"`
	Bound    string `json:"bound"`
	Verdict  string `json:"verdict"` // pass, miss, info
	Note     string `json:"note,omitempty"`
}

// rows makes the table from the figures; a bound row passes when the run
// recorded no violation of it.
func rows(res *Results) []Row {
	jobs := float64(res.Jobs)
	a, b := res.Archive, res.Backup
	kib := func(v float64) string { return fmt.Sprintf("%.0f KiB", v/1024) }
	out := []Row{
		{Key: "archives-per-parent", Figure: "archives per parent job once the plugin settled, most",
			Measured: fmt.Sprintf("%d", a.Max), Bound: fmt.Sprintf("≤ keep = %d", res.Keep), Verdict: bench.PassIf(a.Max <= res.Keep && a.Max > 0),
			Note: fmt.Sprintf("%d archives of %d parent jobs, each recorded with its run's parent job; per parent %v; during the churn at most %d of one parent in %d samples (retention runs after each release)",
				len(a.Archives), res.Parents, a.PerParent, a.Peak, a.Samples)},
		{Key: "archive-bytes", Figure: "archive: bytes kept, per job",
			Measured: fmt.Sprintf("%.1f MiB, %s per job", mib(a.Bytes), kib(float64(a.Bytes)/jobs)), Bound: "—", Verdict: "info",
			Note: fmt.Sprintf("ZFS's used of the %d archives (the keeper's snapshots on them included), over %d runs of %d MiB each; the container uses %.1f MiB", len(a.Archives), res.Jobs, res.DataMiB, mib(a.ContainerBytes))},
		{Key: "keeper-snapshots", Figure: "the keeper's snapshots on one archive once the plugin settled, most",
			Measured: fmt.Sprintf("%d", a.Snapshots), Bound: "1 (the base of the next increment)", Verdict: bench.PassIf(a.Snapshots <= 1),
			Note: "reported, not enforced: more are snapshots whose destroy failed after a send (the plugin's warnings say why); they go at the dataset's next backup, and count in the archive's bytes"},
		{Key: "backup-dir", Figure: "backup_dir once the plugin settled, per job",
			Measured: fmt.Sprintf("%.1f MiB, %s per job", mib(b.Bytes), kib(float64(b.Bytes)/jobs)), Bound: "—", Verdict: "info",
			Note: fmt.Sprintf("%d files: %d streams (%d full, %d incremental, %.1f MiB), their manifests; chains per parent %v; no chain is old enough yet for retention (backup.PruneGrace = %s)",
				b.Files, b.Streams, b.Full, b.Incremental, mib(b.StreamBytes), b.Chains, durText(backup.PruneGrace))},
		{Key: "backup-dir-stray", Figure: "backup_dir: files that no manifest names",
			Measured: fmt.Sprintf("%d", len(b.Stray)+len(b.Problems)), Bound: "none", Verdict: bench.PassIf(len(b.Stray)+len(b.Problems) == 0)},
		{Key: "backup-dir-retention", Figure: "backup_dir retention keeps once the grace has passed (PlanPrune), per job",
			Measured: fmt.Sprintf("%.1f MiB, %s per job", mib(b.KeptBytes), kib(float64(b.KeptBytes)/jobs)),
			Bound:    fmt.Sprintf("≤ keep = %d chains per parent, none broken", res.Keep), Verdict: bench.PassIf(maxOf(b.KeptChains) <= res.Keep && len(b.Broken) == 0),
			Note: fmt.Sprintf("%d streams; chains per parent %v; within the grace now: %.1f MiB more", b.KeptStreams, b.KeptChains, mib(b.Bytes-b.KeptBytes))},
	}
	if b.After != nil {
		out = append(out, Row{Key: "backup-dir-pruned", Figure: "backup_dir after the keeper's retention pass with the grace over",
			Measured: fmt.Sprintf("%.1f MiB, %s per job", mib(b.After.Bytes), kib(float64(b.After.Bytes)/jobs)),
			Bound:    "what the plan keeps; every parent's newest chain verifies",
			Verdict:  bench.PassIf(b.After.Bytes == b.KeptBytes && b.Verified == res.Parents && len(b.After.Stray) == 0),
			Note: fmt.Sprintf("%d streams, chains per parent %v; %d of %d newest chains verify (size and SHA-256); run after the agent stopped",
				b.After.Streams, b.After.Chains, b.Verified, res.Parents)})
	}
	out = append(out, Row{Key: "throughput", Figure: "throughput: runs ended per second",
		Measured: fmt.Sprintf("%.2f jobs/s", res.JobsPerSecond), Bound: "—", Verdict: "info",
		Note: fmt.Sprintf("%d runs from the first force to the last allocation terminal, %.1f s, at most %d forced and not ended at once through %d slots; %d did not complete; settled %.1f s after",
			res.Jobs, res.ChurnSeconds, res.InFlight, res.Slots, res.Failed, res.SettleSeconds)})
	if b.SendP50 > 0 {
		out = append(out, Row{Key: "send-in-churn", Figure: "keeper's send during the churn, p50 per stream",
			Measured: fmt.Sprintf("%s, %.1f MiB/s", fmtDur(b.SendP50), b.SendMiBps), Bound: "—", Verdict: "info",
			Note: fmt.Sprintf("from a manifest's creation to its stream's last write, over %d streams (p50 %s); MiB/s is all their bytes over all their time",
				b.Streams, kib(float64(b.SendStream)))})
	}
	if m := res.Move; m != nil {
		out = append(out, Row{Key: "send-ratio", Figure: "send throughput: keeper's send + receive against `zfs send \\| zfs receive` of the same snapshot",
			Measured: fmt.Sprintf("%s (%.1f MiB/s) / %s (%.1f MiB/s): %.2f×", fmtDur(m.MoveP50), m.MoveMiBps, fmtDur(m.MoveFloorP50), m.FloorMiBps, m.MoveRatio),
			Bound:    "—", Verdict: "info",
			Note: fmt.Sprintf("bench.RunMove (the mobility measure) in this run, after the churn: %d MiB of random data as each run writes, %d pairs alternating, between two pools of its own", m.DataMiB, m.Reps)})
	}
	return out
}

func durText(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%.0f min", d.Minutes())
	}
	return d.String()
}

func fmtDur(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", bench.Millis(d))
}

// WriteMarkdown prints the periodic table and its notes.
func WriteMarkdown(w io.Writer, r *Results) {
	m := r.Machine
	fmt.Fprintf(w, "### Periodic jobs with archive: %d runs of %d parent jobs through %d slots, keep = %d, %d MiB per run\n\n", r.Jobs, r.Parents, r.Slots, r.Keep, r.DataMiB)
	fmt.Fprintf(w, "Machine: %d CPUs, %s, Linux %s, %s, %s; the run took %.0f s.\n\n", m.CPUs, m.ZFS, m.Kernel, m.Go, m.Date, r.Seconds)
	fmt.Fprintln(w, "| figure | measured | bound | result |")
	fmt.Fprintln(w, "|---|---:|---|---|")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row.Figure, row.Measured, row.Bound, bench.Verdict(row.Verdict))
	}
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		if row.Note != "" {
			fmt.Fprintf(w, "- %s: %s\n", row.Key, row.Note)
		}
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "- BOUND BROKEN: %s\n", v)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- note: %s\n", n)
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintf(w, "- the plugin logged %d warnings or errors (plugin_warnings in the JSON): %s\n", len(r.Warnings), warningKinds(r.Warnings))
	}
}

// warningKinds counts the plugin's warning lines by message, most first:
// "23 × backup pass incomplete, 1 × ...".
func warningKinds(lines []string) string {
	n := map[string]int{}
	for _, l := range lines {
		_, msg, _ := strings.Cut(l, "nomad-device-zfs: ")
		msg, _, _ = strings.Cut(msg, ": plugin=")
		n[msg]++
	}
	kinds := make([]string, 0, len(n))
	for k := range n {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		if n[kinds[i]] != n[kinds[j]] {
			return n[kinds[i]] > n[kinds[j]]
		}
		return kinds[i] < kinds[j]
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d × %s", n[k], k)
	}
	return strings.Join(parts, ", ")
}

// pluginWarnings returns the plugin's lines at WARN or ERROR in the agent
// log (nil when it cannot be read).
func pluginWarnings(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 256<<10), 4<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "nomad-device-zfs") && (strings.Contains(l, "[WARN]") || strings.Contains(l, "[ERROR]")) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}
