package churn

// The churn table: its rows and their notes, computed from what
// figures recorded (figures.go), and the table printed.

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// Row is one figure of the churn table.
type Row struct {
	Key       string  `json:"key"`
	Figure    string  `json:"figure"`
	Measured  string  `json:"measured"`
	Reference string  `json:"reference"`
	Ratio     string  `json:"ratio"`
	Value     float64 `json:"value"` // what the target is judged on
	Target    string  `json:"target"`
	Verdict   string  `json:"verdict"` // pass, miss, info
	Note      string  `json:"note,omitempty"`
}

// churnRows judges the figures against issue 10's targets.
func churnRows(res *Results) []Row {
	var rows []Row
	// Throughput, over every batch of each kind.
	var pairs []string
	var lastBase float64
	for _, b := range res.Batches {
		if b.Kind == "baseline" {
			lastBase = b.JobsPerSecond
		} else if lastBase > 0 {
			pairs = append(pairs, fmt.Sprintf("%.2f", b.JobsPerSecond/lastBase))
		}
	}
	base, okBase := jobsPerSecond(res.Batches, kindBaseline)
	dev, okDev := jobsPerSecond(res.Batches, kindDevice)
	if okBase && okDev {
		conc := []string{}
		for _, b := range res.Batches {
			conc = append(conc, fmt.Sprintf("%s %.1f s, %d at once", b.Kind, b.Seconds, b.MaxConcurrent))
		}
		rows = append(rows, Row{Key: "throughput", Figure: "throughput, device jobs / baseline jobs",
			Measured: fmt.Sprintf("%.2f jobs/s", dev), Reference: fmt.Sprintf("%.2f jobs/s", base),
			Ratio: fmt.Sprintf("%.2f", dev/base), Value: dev / base, Target: "≥ 0.90", Verdict: bench.PassIf(dev/base >= 0.90),
			Note: fmt.Sprintf("first registration to last allocation terminal; per pair %s; %s", strings.Join(pairs, ", "), strings.Join(conc, "; "))})
	}
	// Reserve on a fresh slot, during churn versus idle.
	idle := reserves(res.Idle)
	var churn, spare, busy []time.Duration
	// The same Reserves split in two: their zfs command, and the rest.
	var idleCmd, idleRest, churnCmd, churnRest []time.Duration
	// And in two other parts: the plugin's own time, and the time outside
	// it (gRPC, the Nomad client saving the answer).
	var idleIn, idleOut, churnIn, churnOut []time.Duration
	// The same two parts for the fresh Reserves alone.
	var freshIn, freshOut []time.Duration
	split := func(a AllocRecord, in, out *[]time.Duration) {
		if a.ReserveMS > 0 && a.ReservePluginMS > 0 {
			*in = append(*in, msDur(a.ReservePluginMS))
			*out = append(*out, msDur(max(0, a.ReserveMS-a.ReservePluginMS)))
		}
	}
	for _, a := range res.Idle {
		split(a, &idleIn, &idleOut)
		if a.ReserveMS > 0 && a.ReserveZFSMS > 0 {
			idleCmd, idleRest = append(idleCmd, msDur(a.ReserveZFSMS)), append(idleRest, msDur(max(0, a.ReserveMS-a.ReserveZFSMS)))
		}
	}
	// byBeside: churnCmd again, by how many other slots' Reserves ran
	// beside each (3 stands for 3 or more).
	var byBeside [4][]time.Duration
	for _, b := range res.Batches {
		beside := reservesBeside(b.Allocs)
		for i, a := range b.Allocs {
			if a.Fresh || a.How == "spare" {
				split(a, &churnIn, &churnOut)
			}
			if a.Fresh {
				split(a, &freshIn, &freshOut)
			}
			if a.ReserveMS > 0 && a.ReserveZFSMS > 0 && (a.Fresh || a.How == "spare") {
				churnCmd, churnRest = append(churnCmd, msDur(a.ReserveZFSMS)), append(churnRest, msDur(max(0, a.ReserveMS-a.ReserveZFSMS)))
				if n := beside[i]; n >= 0 {
					byBeside[min(n, 3)] = append(byBeside[min(n, 3)], msDur(a.ReserveZFSMS))
				}
			}
			switch {
			case a.ReserveMS == 0:
			case a.Fresh:
				churn = append(churn, msDur(a.ReserveMS))
			case a.How == "spare":
				spare = append(spare, msDur(a.ReserveMS))
			default:
				busy = append(busy, msDur(a.ReserveMS))
			}
		}
	}
	if len(idle) > 0 && len(churn) > 0 {
		q := float64(bench.Median(churn)) / float64(bench.Median(idle))
		rows = append(rows, Row{Key: "reserve-fresh", Figure: "Reserve on a slot that is already fresh, p50 during churn",
			Measured: fmtMS(bench.Median(churn)), Reference: fmtMS(bench.Median(idle)) + " idle", Ratio: fmt.Sprintf("%.2f×", q), Value: q,
			Target: "≤ 3× idle", Verdict: bench.PassIf(q <= 3),
			Note: fmt.Sprintf("Nomad client's \"devices\" prestart hook (TRACE log: Reserve over gRPC + saving its answer); fresh = the plugin logged the slot's fresh dataset after its last reservation; %d fresh samples (max %s), %d idle; %d more Reserves were given a slot whose tenant had ended but that was not fresh yet, and waited for its release (p50 %s, max %s)",
				len(churn), fmtMS(bench.Percentile(churn, 100)), len(idle), len(busy), fmtMS(bench.Median(busy)), fmtMS(bench.Percentile(busy, 100))) + freshPartsNote(freshIn, freshOut, bench.Median(idle)) + freshWaveNote(res)})
	}
	if len(idle) > 0 && len(spare) > 0 {
		q := float64(bench.Median(spare)) / float64(bench.Median(idle))
		rows = append(rows, Row{Key: "reserve-spare", Figure: "Reserve handed the spare of a slot whose tenant ended, p50 during churn",
			Measured: fmtMS(bench.Median(spare)), Reference: fmtMS(bench.Median(idle)) + " idle", Ratio: fmt.Sprintf("%.2f×", q), Value: q,
			Target: "≤ 3× idle", Verdict: bench.PassIf(q <= 3),
			Note: fmt.Sprintf("the plugin's \"slot reserved\" line says how (how=spare): the spare (armed) handed over in memory, no zfs command (at placement when prepared, see the prepared row), the ended tenant's dataset's fate written behind it and the dataset archived; %d samples (max %s)", len(spare), fmtMS(bench.Percentile(spare, 100)))})
	}
	if len(idleCmd) > 0 && len(churnCmd) > 0 {
		q := float64(bench.Median(churnCmd)) / float64(bench.Median(idleCmd))
		rows = append(rows, Row{Key: "reserve-zfs", Figure: "the zfs set of those Reserves (fresh and spare) not prepared, p50 during churn",
			Measured: fmtMS(bench.Median(churnCmd)), Reference: fmtMS(bench.Median(idleCmd)) + " idle", Ratio: fmt.Sprintf("%.2f×", q), Value: q,
			Target: "—", Verdict: "info",
			Note: fmt.Sprintf("from the plugin's runner (\"ran\" lines at TRACE): the longest zfs set of a slot state on the slot's datasets inside each Reserve; the rest of the Reserve (gRPC, the allocation read that identifies the asker when it ends later than the command, Nomad saving the answer): p50 %s during churn (max %s), %s idle; %d and %d samples",
				fmtMS(bench.Median(churnRest)), fmtMS(bench.Percentile(churnRest, 100)), fmtMS(bench.Median(idleRest)), len(churnCmd), len(idleCmd)) + besideNote(byBeside) + readsNote(res.reads) + lockWaitsNote(res.lockWaits)})
	}
	if len(idle) > 0 && len(idleOut) > 0 && len(churnOut) > 0 {
		q := float64(bench.Median(churnOut)) / float64(bench.Median(idleOut))
		floor := float64(bench.Median(churnOut)) / float64(bench.Median(idle))
		rows = append(rows, Row{Key: "reserve-outside", Figure: "the part of those Reserves outside the plugin, p50 during churn",
			Measured: fmtMS(bench.Median(churnOut)), Reference: fmtMS(bench.Median(idleOut)) + " idle", Ratio: fmt.Sprintf("%.2f×", q), Value: q,
			Target: "—", Verdict: "info",
			Note: fmt.Sprintf("the Nomad client's hook less the plugin's own time (from the Reserve's arrival to its \"slot reserved\" line: p50 %s during churn, %s idle): gRPC and the client saving the answer, on the same CPUs as the churn; alone it is %.2f× the whole idle Reserve, the least a fresh Reserve's ratio could be if the plugin took no time at all; %d and %d samples",
				fmtMS(bench.Median(churnIn)), fmtMS(bench.Median(idleIn)), floor, len(churnOut), len(idleOut))})
	}
	if row, ok := stormRow(res); ok {
		rows = append(rows, row)
	}
	rows = append(rows, preparedRows(res)...)
	// Recycle and health shown during the release.
	var recycle, recycleTask, shownDelay, again, toStart, work []time.Duration
	shown, last, n, spared := 0, 0, 0, 0
	for _, rel := range res.Releases {
		if rel.RecycleMS > 0 {
			recycle = append(recycle, msDur(rel.RecycleMS))
			recycleTask = append(recycleTask, msDur(rel.RecycleFromTaskMS))
			toStart = append(toStart, rel.Start.Sub(rel.AllocTerminal))
			work = append(work, rel.Fresh.Sub(rel.Start))
		}
		if rel.Fresh.IsZero() {
			continue
		}
		if rel.Spare {
			spared++
			continue
		}
		n++
		if rel.ShownUnhealthy {
			shown++
			shownDelay = append(shownDelay, msDur(rel.UnhealthyDelayMS))
		}
		again = append(again, msDur(rel.HealthyAgainMS))
		if rel.OthersReleasing >= res.Slots-1 {
			last++
		}
	}
	if len(recycle) > 0 {
		p50, top := bench.Median(recycle), bench.Percentile(recycle, 100)
		rows = append(rows,
			Row{Key: "recycle-p50", Figure: "recycle: allocation terminal → slot healthy again in the node API, p50", Measured: fmtMS(p50),
				Value: p50.Seconds(), Target: "≤ 1 s", Verdict: bench.PassIf(p50 <= time.Second),
				Note: fmt.Sprintf("%d releases; terminal = the allocation's modify time; from the task's Terminated event instead: p50 %s, max %s; parts (p50 / max): terminal → \"release started\" %s / %s, release → fresh dataset %s / %s, fresh → healthy in the node API: see healthy-again",
					len(recycle), fmtMS(bench.Median(recycleTask)), fmtMS(bench.Percentile(recycleTask, 100)),
					fmtMS(bench.Median(toStart)), fmtMS(bench.Percentile(toStart, 100)), fmtMS(bench.Median(work)), fmtMS(bench.Percentile(work, 100)))},
			Row{Key: "recycle-max", Figure: "recycle, max", Measured: fmtMS(top), Value: top.Seconds(), Target: "≤ 3 s", Verdict: bench.PassIf(top <= 3*time.Second)})
	}
	if spared > 0 {
		rows = append(rows, Row{Key: "spare-releases", Figure: "releases whose slot served its spare at once (never unhealthy)",
			Measured: fmt.Sprintf("%d of %d releases", spared, spared+n), Value: float64(spared) / float64(spared+n), Target: "—", Verdict: "info",
			Note: "the plugin's \"release started\" line names the spare: the slot was offered (or handed to its next tenant) from the release's start, so Nomad had nothing to show; the health rows below are judged on the other releases"})
	}
	if n > 0 {
		v := "miss"
		if shown == n && bench.Percentile(shownDelay, 100) <= time.Second {
			v = "pass"
		}
		delay := "—"
		if len(shownDelay) > 0 {
			delay = fmt.Sprintf("delay p50 %s, max %s", fmtMS(bench.Median(shownDelay)), fmtMS(bench.Percentile(shownDelay, 100)))
		}
		rows = append(rows,
			Row{Key: "unhealthy-shown", Figure: "Nomad shows the slot unhealthy while it is released", Measured: fmt.Sprintf("%d of %d releases", shown, n),
				Reference: delay, Value: float64(shown) / float64(n), Target: "every release, within 1 s of its start", Verdict: v,
				Note: fmt.Sprintf("node API polled every %s; delay from the plugin's \"release started\" line; the Nomad client sends node changes to the servers 1 s after the first one in dev mode (5–10 s otherwise: watchNodeUpdates in client/client.go), so a release shorter than that is never shown; %d releases began while every other slot was being released too (where a rule that keeps the class's last instance offered would apply); %d fingerprints sent over the run", churnPollPeriod, last, res.Fingerprs)},
			sentRow(res),
			Row{Key: "healthy-again", Figure: "healthy again after the fresh dataset, p50 / max", Measured: fmtMS(bench.Median(again)) + " / " + fmtMS(bench.Percentile(again, 100)),
				Value: bench.Percentile(again, 100).Seconds(), Target: "≤ 1 s", Verdict: bench.PassIf(bench.Percentile(again, 100) <= time.Second),
				Note: "from the plugin's \"slot changed: create slot\" line to the first node API sample showing it healthy"})
	}
	// zfs processes per device job, net of the periodic refreshes.
	var baseProcs, devProcs, devJobs int
	var baseSecs, devSecs float64
	for _, b := range res.Batches {
		if b.Kind == "baseline" {
			baseProcs, baseSecs = baseProcs+b.ZFSProcesses, baseSecs+b.WindowSeconds
		} else {
			devProcs, devSecs, devJobs = devProcs+b.ZFSProcesses, devSecs+b.WindowSeconds, devJobs+len(b.Allocs)
		}
	}
	if devJobs > 0 && baseSecs > 0 {
		rate := float64(baseProcs) / baseSecs
		net := (float64(devProcs) - rate*devSecs) / float64(devJobs)
		rows = append(rows, Row{Key: "zfs-per-job", Figure: "zfs processes per device job", Measured: fmt.Sprintf("%.1f", net),
			Reference: fmt.Sprintf("%.1f gross", float64(devProcs)/float64(devJobs)), Value: net, Target: "≤ 8", Verdict: bench.PassIf(net <= 8),
			Note: fmt.Sprintf("counting wrapper first on the agent's PATH; %d processes over %d device jobs in %.0f s, less the periodic refreshes at the rate of the baseline batches (%.2f/s)", devProcs, devJobs, devSecs, rate)})
	}
	if row, ok := turnRow(res.Batches, res.Slots); ok {
		rows = append(rows, row)
	}
	if row, ok := cpuRow(res.Batches); ok {
		row.Note += listReadsNote(res)
		rows = append(rows, row)
	}
	rows = append(rows, nullRows(res)...)
	rows = append(rows, controlRows(res)...)
	if row, ok := inFlightRow(res); ok {
		rows = append(rows, row)
	}
	rows = append(rows, floorRows(res)...)
	if row, ok := reachRow(res); ok {
		rows = append(rows, row)
	}
	if res.RSSStart > 0 {
		q := float64(res.RSSEnd) / float64(res.RSSStart)
		rows = append(rows, Row{Key: "memory", Figure: "plugin memory (RSS) over the churn", Measured: fmt.Sprintf("%.1f MiB end", mib(res.RSSEnd)),
			Reference: fmt.Sprintf("%.1f MiB start", mib(res.RSSStart)), Ratio: fmt.Sprintf("%.2f×", q), Value: q, Target: "end ≤ 1.25× start",
			Verdict: bench.PassIf(q <= 1.25), Note: fmt.Sprintf("VmRSS of the plugin process; peak (VmHWM) at the end %.1f MiB", mib(res.HWMEnd))})
	}
	return rows
}

// jobsPerSecond is the throughput of the batches of kind: their jobs over
// their seconds; false when they took none.
func jobsPerSecond(batches []BatchResult, kind string) (float64, bool) {
	jobs, secs := 0, 0.0
	for _, b := range batches {
		if b.Kind == kind {
			jobs, secs = jobs+len(b.Allocs), secs+b.Seconds
		}
	}
	if secs <= 0 {
		return 0, false
	}
	return float64(jobs) / secs, true
}

// reserves returns the Reserves (the devices hooks) of allocs that the log
// timed.
func reserves(allocs []AllocRecord) []time.Duration {
	var out []time.Duration
	for _, a := range allocs {
		if a.ReserveMS > 0 {
			out = append(out, msDur(a.ReserveMS))
		}
	}
	return out
}

func msDur(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func fmtMS(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	if d >= 100*time.Millisecond {
		return fmt.Sprintf("%.0f ms", bench.Millis(d))
	}
	return fmt.Sprintf("%.1f ms", bench.Millis(d))
}

// WriteMarkdown prints the churn table and its notes.
func WriteMarkdown(w io.Writer, r *Results) {
	m := r.Machine
	fmt.Fprintf(w, "### Churn: %d jobs through %d slots, real Nomad agent\n\n", r.Jobs, r.Slots)
	fmt.Fprintf(w, "Machine: %d CPUs, %s, Linux %s, %s, %s; node CPU %d MHz (%d tasks of %d MHz at once); the run took %.0f s.\n\n",
		m.CPUs, m.ZFS, m.Kernel, m.Go, m.Date, r.NodeCPU, r.NodeCPU/churnTaskCPU, churnTaskCPU, r.Seconds)
	fmt.Fprintln(w, "| figure | measured | reference | ratio | target | result |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---|")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", row.Figure, row.Measured, bench.OrDash(row.Reference), bench.OrDash(row.Ratio), row.Target, bench.Verdict(row.Verdict))
	}
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		if row.Note != "" {
			fmt.Fprintf(w, "- %s: %s\n", row.Key, row.Note)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "- note: %s\n", n)
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintf(w, "- the plugin logged %d warnings or errors (see plugin_warnings in the JSON)\n", len(r.Warnings))
	}
}

// sentRow is the plugin's part of the health figures: how soon it sent
// Nomad a fingerprint showing a slot unhealthy after its release started,
// and healthy after its fresh dataset. What the node API shows adds the
// Nomad client's own delay.
func sentRow(res *Results) Row {
	var down, up []time.Duration
	n, kept := 0, 0
	for _, rel := range res.Releases {
		if rel.Fresh.IsZero() || rel.Spare {
			continue
		}
		n++
		if rel.SentUnhealthyMS >= 0 {
			down = append(down, msDur(rel.SentUnhealthyMS))
		} else {
			kept++
		}
		if rel.SentHealthyMS >= 0 {
			up = append(up, msDur(rel.SentHealthyMS))
		}
	}
	worst := max(bench.Percentile(down, 100), bench.Percentile(up, 100))
	return Row{Key: "health-sent", Figure: "plugin sends the health change to Nomad: unhealthy after the release starts / healthy after the fresh dataset, p50 (max)",
		Measured: fmt.Sprintf("%s (%s) / %s (%s)", fmtMS(bench.Median(down)), fmtMS(bench.Percentile(down, 100)), fmtMS(bench.Median(up)), fmtMS(bench.Percentile(up, 100))),
		Value:    worst.Seconds(), Target: "≤ 1 s", Verdict: bench.PassIf(len(up) > 0 && worst <= time.Second),
		Note: fmt.Sprintf("from the plugin's \"fingerprint sent\" lines; %d of %d releases sent unhealthy, the other %d kept the slot offered as the class's last healthy instance (\"fresh soon\")", len(down), n, kept)}
}

// cpuRow is the CPU time a device job costs against a baseline job, and
// where the difference goes: on a 2-core machine that the churn keeps busy,
// it is the time the jobs beside it wait.
func cpuRow(batches []BatchResult) (Row, bool) {
	var base, dev CPUUse
	var baseJobs, devJobs int
	add := func(to *CPUUse, u *CPUUse) {
		to.Machine += u.Machine
		to.Plugin += u.Plugin
		to.ZFSCommands += u.ZFSCommands
		to.ZFSDaemon += u.ZFSDaemon
		to.Agent += u.Agent
		to.AgentChildren += u.AgentChildren
	}
	for _, b := range batches {
		if b.CPU == nil {
			continue
		}
		if b.Kind == "baseline" {
			add(&base, b.CPU)
			baseJobs += len(b.Allocs)
		} else {
			add(&dev, b.CPU)
			devJobs += len(b.Allocs)
		}
	}
	if baseJobs == 0 || devJobs == 0 {
		return Row{}, false
	}
	per := func(v float64, n int) float64 { return v / float64(n) }
	extra := func(d, b float64) string { return fmt.Sprintf("%+.0f ms", 1000*(per(d, devJobs)-per(b, baseJobs))) }
	q := per(dev.Machine, devJobs) / per(base.Machine, baseJobs)
	return Row{Key: "cpu-per-job", Figure: "machine CPU time per job, device / baseline",
		Measured:  fmt.Sprintf("%.2f s", per(dev.Machine, devJobs)),
		Reference: fmt.Sprintf("%.2f s", per(base.Machine, baseJobs)), Ratio: fmt.Sprintf("%.2f×", q), Value: q, Target: "—", Verdict: "info",
		Note: fmt.Sprintf("busy CPU time of the whole machine from a batch's start until its slots settled, per job; a device job's extra, by part: zfs commands %s, zfs-fuse daemon %s, plugin %s, Nomad agent %s, executors and tasks %s; the rest is the kernel and the benchmark's own polling",
			extra(dev.ZFSCommands, base.ZFSCommands), extra(dev.ZFSDaemon, base.ZFSDaemon), extra(dev.Plugin, base.Plugin), extra(dev.Agent, base.Agent), extra(dev.AgentChildren, base.AgentChildren))}, true
}

// listReadsNote gives, for each batch of 40 in run order, how many times
// the plugin read the node's allocation list and the most allocations a
// read listed: each carries its job, so a read costs the agent and the
// plugin in proportion, and every batch starts on a node emptied by a
// forced garbage collection so that none pays for the ones before it.
func listReadsNote(res *Results) string {
	var parts []string
	for _, bs := range res.allBatches() {
		for _, b := range bs {
			parts = append(parts, fmt.Sprintf("%s %d (up to %d)", b.Kind, b.ListReads, b.ListMost))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; the plugin's reads of the node's allocation list, blocking or not, per batch: " + strings.Join(parts, ", ")
}

// turnParts splits the turns of one batch: the time from an allocation's
// end (its terminal time) to the placement that took its place, and from
// each such placement to its task's start. With at most slots tasks at
// once, the i-th placement (in time) after the first slots ones waits for
// the (i-slots)-th end. Every allocation with a placement and an end
// counts in that order (one that never started held its place all the
// same); a turn whose placement came before its end, or whose task never
// started, gives no sample.
func turnParts(allocs []AllocRecord, slots int) (toPlaced, toStart []time.Duration) {
	var recs []AllocRecord
	var ended []time.Time
	for _, a := range allocs {
		if a.Placed.IsZero() || a.Terminal.IsZero() {
			continue
		}
		recs = append(recs, a)
		ended = append(ended, a.Terminal)
	}
	slices.SortStableFunc(recs, func(x, y AllocRecord) int { return x.Placed.Compare(y.Placed) })
	slices.SortFunc(ended, time.Time.Compare)
	for i := slots; i < len(recs); i++ {
		wait := recs[i].Placed.Sub(ended[i-slots])
		if wait < 0 || recs[i].Started.IsZero() {
			continue
		}
		toPlaced = append(toPlaced, wait)
		toStart = append(toStart, recs[i].Started.Sub(recs[i].Placed))
	}
	return toPlaced, toStart
}

// turnRow shows where the time between one task's end and the next one's
// start goes, for device jobs against baseline jobs: to the scheduler's
// placement, then to the task's start on the client (the devices hook,
// that is Reserve, among its steps).
func turnRow(batches []BatchResult, slots int) (Row, bool) {
	if slots <= 0 {
		return Row{}, false
	}
	parts := map[string][2][]time.Duration{}
	for _, b := range batches {
		p, s := turnParts(b.Allocs, slots)
		cur := parts[b.Kind]
		parts[b.Kind] = [2][]time.Duration{append(cur[0], p...), append(cur[1], s...)}
	}
	dev, base := parts["device"], parts["baseline"]
	if len(dev[0]) == 0 || len(base[0]) == 0 || len(dev[1]) == 0 || len(base[1]) == 0 {
		return Row{}, false
	}
	show := func(p [2][]time.Duration) string {
		return fmtMS(bench.Median(p[0])) + " + " + fmtMS(bench.Median(p[1]))
	}
	return Row{Key: "turn", Figure: "a task's end → the next placement + that placement → its task's start, p50",
		Measured: show(dev), Reference: show(base) + " baseline", Target: "—", Verdict: "info",
		Note: fmt.Sprintf("end = the allocation's terminal (modify) time, placement = the next allocation's create time, paired in time order with at most %d tasks at once; %d and %d turns (device, baseline); the device job's start includes its Reserve (reserve rows)", slots, len(dev[0]), len(base[0]))}, true
}

// preparedRows says how many Reserves of the device batches were handed
// over as prepared (the slot reserved when the allocation was placed), how
// many found the preparation done, and what each kind cost in the plugin.
func preparedRows(res *Results) []Row {
	var all, prepared, ready int
	var readyIn, waitedIn, waits, preps, leads []time.Duration
	var idleIn []time.Duration
	for _, a := range res.Idle {
		if a.Prepared && a.ReservePluginMS > 0 {
			idleIn = append(idleIn, msDur(a.ReservePluginMS))
		}
	}
	for _, b := range res.Batches {
		for _, a := range b.Allocs {
			if a.ReserveMS == 0 {
				continue
			}
			all++
			if !a.Prepared {
				continue
			}
			prepared++
			preps = append(preps, msDur(a.PrepMS))
			leads = append(leads, msDur(a.PrepLeadMS))
			if a.PrepLeadMS >= 0 {
				ready++
				readyIn = append(readyIn, msDur(a.ReservePluginMS))
			} else {
				waitedIn = append(waitedIn, msDur(a.ReservePluginMS))
				waits = append(waits, msDur(-a.PrepLeadMS))
			}
		}
	}
	if all == 0 {
		return nil
	}
	return []Row{{Key: "reserve-prepared", Figure: "Reserves whose slot was prepared at placement (reserved before the task asked)",
		Measured: fmt.Sprintf("%d of %d", prepared, all), Reference: fmt.Sprintf("%d ready when asked", ready), Target: "—", Verdict: "info",
		Note: fmt.Sprintf("the plugin's \"slot prepared\" and \"slot reserved … prepared=true\" lines; in the plugin (arrival to answer), p50: ready %s (%d), waited for the preparation %s (%d, the wait p50 %s), idle %s (%d); the preparation's zfs work p50 %s, ended p50 %s before the Reserve arrived (negative: after)",
			fmtMS(bench.Median(readyIn)), len(readyIn), fmtMS(bench.Median(waitedIn)), len(waitedIn), fmtMS(bench.Median(waits)), fmtMS(bench.Median(idleIn)), len(idleIn),
			fmtMS(bench.Median(preps)), fmtMS(bench.Median(leads)))}}
}
