package churn

// The rows of the floor control (floor.go): the plugin judged against it
// as against the null control (control.go), the floor against the null
// control (how much of the gap is ZFS itself), and the zfs processes per
// job of each, by command.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// floorRows are the floor control's rows; none when the run had no floor
// batches, or too few samples of a side.
func floorRows(res *Results) []Row {
	if len(res.Floor) == 0 {
		return nil
	}
	floorWave, floorRest := waveSplit(res.Floor, res.Slots, reserveMS)
	nullWave, nullRest := waveSplit(res.Null, res.Slots, reserveMS)
	wave, rest := waveSplit(res.Batches, res.Slots, reserveMS)
	var rows []Row
	ratio := func(key, figure string, a, b []time.Duration, judged bool, note string) {
		if len(a) == 0 || len(b) == 0 {
			return
		}
		p, c := bench.Median(a), bench.Median(b)
		q := float64(p) / float64(c)
		row := Row{Key: key, Figure: figure, Measured: fmtMS(p), Ratio: fmt.Sprintf("%.2f×", q), Value: q, Target: "—", Verdict: "info",
			Note: fmt.Sprintf("p50 of the devices hook, %d and %d samples; %s", len(a), len(b), note)}
		if judged {
			row.Reference, row.Target, row.Verdict = fmtMS(c)+" floor", fmt.Sprintf("≤ %.1f× the floor", controlReserveMax), bench.PassIf(q <= controlReserveMax)
		} else {
			row.Reference = fmtMS(c) + " null"
		}
		rows = append(rows, row)
	}
	ratio("floor-judged-wave", fmt.Sprintf("Reserve in a launch storm against the floor control: the first %d tasks of each batch, p50", res.Slots),
		wave, floorWave, true, "the plugin's batches against the floor's: the null device's jobs, each given a dataset of the same pool made for it and destroyed at its end (floor.go)")
	ratio("floor-judged-rest", "Reserve after the first wave against the floor control, p50",
		rest, floorRest, true, "the same, the tasks after each batch's first wave")
	dev, okDev := jobsPerSecond(res.Batches, kindDevice)
	fl, okFloor := jobsPerSecond(res.Floor, kindFloor)
	if okDev && okFloor && fl > 0 {
		q := dev / fl
		rows = append(rows, Row{Key: "floor-judged-throughput", Figure: "throughput against the floor control: device jobs / floor jobs",
			Measured: fmt.Sprintf("%.2f jobs/s", dev), Reference: fmt.Sprintf("%.2f jobs/s floor", fl), Ratio: fmt.Sprintf("%.2f", q), Value: q,
			Target: fmt.Sprintf("≥ %.2f", controlThroughputMin), Verdict: bench.PassIf(q >= controlThroughputMin),
			Note: "what the plugin's work beyond one zfs create and one zfs destroy per job (archive, owner and state, proof, spares) costs the node's throughput"})
	}
	ratio("floor-null-wave", "floor control against the null control: Reserve in the first wave, p50", floorWave, nullWave, false,
		"the floor's Reserve binds a dataset made before it (or waits for it): what the ZFS work of the jobs before it costs a Reserve in the same seconds")
	ratio("floor-null-rest", "floor control against the null control: Reserve after the first wave, p50", floorRest, nullRest, false,
		"the same, after the first wave, where each Reserve comes while the floor driver takes back the dataset of the job that ended before it")
	n, okNull := jobsPerSecond(res.Null, kindNull)
	if okFloor && okNull && n > 0 {
		rows = append(rows, Row{Key: "floor-null-throughput", Figure: "floor control against the null control: throughput",
			Measured: fmt.Sprintf("%.2f jobs/s", fl), Reference: fmt.Sprintf("%.2f jobs/s null", n), Ratio: fmt.Sprintf("%.2f", fl/n), Value: fl / n,
			Target: "—", Verdict: "info", Note: "what one zfs create and one zfs destroy per job, and each task's write through zfs-fuse, cost the node's throughput"})
	}
	if row, ok := floorCountsRow(res); ok {
		rows = append(rows, row)
	}
	return rows
}

// floorCountsRow sets the zfs processes per job of the floor control
// against the plugin's, by command, each net of the periodic refreshes.
func floorCountsRow(res *Results) (Row, bool) {
	all := append(slices.Clone(res.Batches), res.Floor...)
	plugin, pTotal, okP := netPerJob(all, kindDevice)
	floor, fTotal, okF := netPerJob(all, kindFloor)
	if !okP || !okF {
		return Row{}, false
	}
	return Row{Key: "floor-zfs-per-job", Figure: "zfs processes per job: the plugin's against the floor control's",
		Measured: fmt.Sprintf("%.1f", pTotal), Reference: fmt.Sprintf("%.1f floor", fTotal), Ratio: fmt.Sprintf("%.2f×", pTotal/fTotal), Value: pTotal,
		Target: "—", Verdict: "info",
		Note: fmt.Sprintf("by command, per job, net of the periodic refreshes at the baseline batches' rate of each command: the plugin %s; the floor %s", perJobString(plugin), perJobString(floor))}, true
}

// netPerJob is the zfs processes per job of the batches of kind, by
// command, less what the baseline batches ran per second of each (the
// periodic refreshes) over the same windows; total is their sum. False
// when there is no baseline window or no job of kind.
func netPerJob(batches []BatchResult, kind string) (perJob map[string]float64, total float64, ok bool) {
	baseCount, count := bench.Counts{}, bench.Counts{}
	var baseSecs, secs float64
	jobs := 0
	for _, b := range batches {
		switch b.Kind {
		case kindBaseline:
			baseSecs += b.WindowSeconds
			for k, v := range b.ZFSCounts {
				baseCount[k] += v
			}
		case kind:
			secs += b.WindowSeconds
			jobs += len(b.Allocs)
			for k, v := range b.ZFSCounts {
				count[k] += v
			}
		}
	}
	if baseSecs <= 0 || jobs == 0 {
		return nil, 0, false
	}
	perJob = map[string]float64{}
	for _, k := range slices.Sorted(maps.Keys(count)) {
		net := (float64(count[k]) - float64(baseCount[k])/baseSecs*secs) / float64(jobs)
		perJob[k] = net
		total += net
	}
	return perJob, total, true
}

// perJobString lists perJob by command, most first, leaving out those
// under 0.05 a job.
func perJobString(perJob map[string]float64) string {
	keys := slices.Sorted(maps.Keys(perJob))
	slices.SortStableFunc(keys, func(a, b string) int {
		switch {
		case perJob[a] > perJob[b]:
			return -1
		case perJob[a] < perJob[b]:
			return 1
		}
		return 0
	})
	var parts []string
	for _, k := range keys {
		if perJob[k] >= 0.05 {
			parts = append(parts, fmt.Sprintf("%.2f %s", perJob[k], k))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
