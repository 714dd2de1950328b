package churn

import (
	"fmt"
	"sort"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// A batch registers all its jobs at once, and the node's CPU admits as
// many tasks as there are slots: the first wave of a batch, one task per
// slot, is placed together and started together, each a handful of
// processes (the log collector, the executor, the task), while later tasks
// start one at a time as earlier ones end. The fresh Reserves are the
// device batches' first waves (every slot is fresh at a batch's start and
// never again during it), so they are made during that launch storm,
// which the baseline batches have too with no plugin at work. The
// launch-storm row shows it from Nomad's own timing of each task's
// "logmon" prestart hook (a process start, before the devices hook).

// firstWave reports, for each allocation of b, whether it is among the
// first n the scheduler placed (by create time; ties by job name).
func firstWave(b BatchResult, n int) map[string]bool {
	byPlace := append([]AllocRecord(nil), b.Allocs...)
	sort.SliceStable(byPlace, func(i, j int) bool {
		if !byPlace[i].Placed.Equal(byPlace[j].Placed) {
			return byPlace[i].Placed.Before(byPlace[j].Placed)
		}
		return byPlace[i].Job < byPlace[j].Job
	})
	out := map[string]bool{}
	for i, a := range byPlace {
		if i < n {
			out[a.AllocID] = true
		}
	}
	return out
}

// waveSplit returns ms of the allocations of batches for which it is
// positive, split into their batch's first wave (firstWave, slots tasks)
// and the rest.
func waveSplit(batches []BatchResult, slots int, ms func(AllocRecord) float64) (wave, rest []time.Duration) {
	for _, b := range batches {
		first := firstWave(b, slots)
		for _, a := range b.Allocs {
			v := ms(a)
			if v <= 0 {
				continue
			}
			if first[a.AllocID] {
				wave = append(wave, msDur(v))
			} else {
				rest = append(rest, msDur(v))
			}
		}
	}
	return wave, rest
}

// ofKind returns the batches of kind, in order.
func ofKind(batches []BatchResult, kind string) []BatchResult {
	var out []BatchResult
	for _, b := range batches {
		if b.Kind == kind {
			out = append(out, b)
		}
	}
	return out
}

// reserveMS is an allocation's Reserve (the client's devices hook) and
// logmonMS its log collector's start (the logmon hook), in ms; 0 when the
// log timed none. reserveIf is reserveMS for the allocations keep takes,
// 0 for the others.
func reserveMS(a AllocRecord) float64 { return a.ReserveMS }
func logmonMS(a AllocRecord) float64  { return a.LogmonMS }
func reserveIf(keep func(AllocRecord) bool) func(AllocRecord) float64 {
	return func(a AllocRecord) float64 {
		if !keep(a) {
			return 0
		}
		return a.ReserveMS
	}
}

// stormRow is the launch-storm row: the logmon hook of the batches' first
// waves against the rest, baseline and device; false when the log timed
// none.
func stormRow(res *Results) (Row, bool) {
	type split struct{ first, rest []time.Duration }
	var base, dev split
	base.first, base.rest = waveSplit(ofKind(res.Batches, kindBaseline), res.Slots, logmonMS)
	dev.first, dev.rest = waveSplit(ofKind(res.Batches, kindDevice), res.Slots, logmonMS)
	if len(base.first) == 0 || len(dev.first) == 0 || len(base.rest) == 0 || len(dev.rest) == 0 {
		return Row{}, false
	}
	ratio := func(s split) float64 { return float64(bench.Median(s.first)) / float64(bench.Median(s.rest)) }
	return Row{Key: "launch-storm", Figure: fmt.Sprintf("a task's log collector start (Nomad's logmon hook), p50: the first %d of each batch, started together, against the rest", res.Slots),
		Measured: fmtMS(bench.Median(dev.first)) + " device", Reference: fmtMS(bench.Median(base.first)) + " baseline",
		Ratio: fmt.Sprintf("%.2f× and %.2f× the rest", ratio(dev), ratio(base)), Target: "—", Verdict: "info",
		Note: fmt.Sprintf("Nomad's TRACE timing of each task's \"logmon\" prestart hook, which starts a process; a batch's first %d tasks are placed and started together: device first %s (%d), rest %s (%d); baseline first %s (%d), rest %s (%d). The fresh Reserves are the device batches' first waves, so they are made in this storm, which the baseline batches show with no device and no plugin at work",
			res.Slots, fmtMS(bench.Median(dev.first)), len(dev.first), fmtMS(bench.Median(dev.rest)), len(dev.rest),
			fmtMS(bench.Median(base.first)), len(base.first), fmtMS(bench.Median(base.rest)), len(base.rest))}, true
}

// freshWaveNote says how many of the fresh Reserves during churn were
// their batch's first wave (see stormRow).
func freshWaveNote(res *Results) string {
	wave, rest := waveSplit(ofKind(res.Batches, kindDevice), res.Slots, reserveIf(func(a AllocRecord) bool { return a.Fresh }))
	in, n := len(wave), len(wave)+len(rest)
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d of these %d are their batch's first %d tasks, started together (launch-storm row)", in, n, res.Slots)
}
