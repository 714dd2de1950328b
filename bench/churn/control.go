package churn

// The plugin judged against the control (issue 46): its Reserve and its
// throughput beside the null device's (null.go) at the same moments of a
// batch, not against an idle Reserve. The null device's Reserve is the
// least any device plugin's can be on the same node at the same moment,
// so these ratios are what the plugin itself adds.

import (
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// Targets of the rows judged against the control.
const (
	controlReserveMax    = 1.5  // the plugin's Reserve p50 / the control's, at the same moment
	controlThroughputMin = 0.95 // the plugin's jobs per second / the control's
)

// controlRows are the plugin's Reserve in its batches' first waves and
// after them, each against the control's at the same moment, and its
// throughput against the control's: each judged. None when the run had no
// null batches, or too few samples of either side.
func controlRows(res *Results) []Row {
	nullWave, nullRest := waveSplit(res.Null, res.Slots, reserveMS)
	wave, rest := waveSplit(res.Batches, res.Slots, reserveMS)
	var rows []Row
	judge := func(key, figure string, plugin, control []time.Duration, when string) {
		if len(plugin) == 0 || len(control) == 0 {
			return
		}
		p, c := bench.Median(plugin), bench.Median(control)
		q := float64(p) / float64(c)
		rows = append(rows, Row{Key: key, Figure: figure,
			Measured: fmtMS(p), Reference: fmtMS(c) + " control", Ratio: fmt.Sprintf("%.2f×", q), Value: q,
			Target: fmt.Sprintf("≤ %.1f× the control", controlReserveMax), Verdict: bench.PassIf(q <= controlReserveMax),
			Note: fmt.Sprintf("p50 of the devices hook %s: the plugin's batches (%d samples) against the null device's (%d samples), run after them on the same agent", when, len(plugin), len(control))})
	}
	judge("null-judged-wave", fmt.Sprintf("Reserve in a launch storm against the control: the first %d tasks of each batch (started together), p50", res.Slots),
		wave, nullWave, "of each batch's first wave")
	judge("null-judged-rest", "Reserve after the first wave against the control (one at a time as earlier ones end), p50",
		rest, nullRest, "of the tasks after each batch's first wave")
	d, okDev := jobsPerSecond(res.Batches, kindDevice)
	n, okNull := jobsPerSecond(res.Null, kindNull)
	if okDev && okNull && n > 0 {
		q := d / n
		rows = append(rows, Row{Key: "null-judged-throughput", Figure: "throughput against the control: device jobs / null device jobs",
			Measured: fmt.Sprintf("%.2f jobs/s", d), Reference: fmt.Sprintf("%.2f jobs/s control", n), Ratio: fmt.Sprintf("%.2f", q), Value: q,
			Target: fmt.Sprintf("≥ %.2f", controlThroughputMin), Verdict: bench.PassIf(q >= controlThroughputMin),
			Note: "the same batches of jobs asking for the plugin's device and for the null device's: what the plugin's work (Reserve, release, spares) costs the node's throughput beyond asking for a device at all"})
	}
	return rows
}
