package churn

// What is within reach (issue 46): the floor control judged by the issue's
// three targets against the null control, exactly as the plugin is judged
// (control.go). The floor does one zfs create and one zfs destroy a job and
// nothing else (floor.go): one schedule of the least ZFS work that an
// implementation giving each job a dataset of its own pays on the same
// pool (not a bound: one that put its destroys off could read better). A
// target the floor misses in a run was out of that work's reach in that
// run; the row says which of the plugin's misses the floor shared.

import (
	"fmt"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// targetNames name the three targets, in the order of targets.
var targetNames = [3]string{"first wave", "after the first wave", "throughput"}

// targets are a subject's three figures against the null control: its
// Reserve's p50 in the batches' first waves and after them, each ÷ the
// null device's at the same positions, and its throughput ÷ the null
// device's. has says which of the three both sides had samples for.
type targets struct {
	ratio [3]float64
	has   [3]bool
}

// judgeTargets computes subject's targets (batches of kind) against the
// run's null batches.
func judgeTargets(subject []BatchResult, kind string, res *Results) targets {
	var t targets
	nullWave, nullRest := waveSplit(res.Null, res.Slots, reserveMS)
	wave, rest := waveSplit(subject, res.Slots, reserveMS)
	for i, pair := range [2][2][]time.Duration{{wave, nullWave}, {rest, nullRest}} {
		if len(pair[0]) > 0 && len(pair[1]) > 0 {
			t.ratio[i], t.has[i] = float64(bench.Median(pair[0]))/float64(bench.Median(pair[1])), true
		}
	}
	s, okS := jobsPerSecond(subject, kind)
	n, okN := jobsPerSecond(res.Null, kindNull)
	if okS && okN && n > 0 {
		t.ratio[2], t.has[2] = s/n, true
	}
	return t
}

// met says which targets were computed and met.
func (t targets) met() [3]bool {
	return [3]bool{
		t.has[0] && t.ratio[0] <= controlReserveMax,
		t.has[1] && t.ratio[1] <= controlReserveMax,
		t.has[2] && t.ratio[2] >= controlThroughputMin,
	}
}

// reachRow is the floor control against the three targets, and the
// plugin's misses that the floor missed too; false when the run had no
// floor or no null batches, or either side lacks a figure.
func reachRow(res *Results) (Row, bool) {
	if len(res.Floor) == 0 || len(res.Null) == 0 {
		return Row{}, false
	}
	floor := judgeTargets(res.Floor, kindFloor, res)
	plugin := judgeTargets(res.Batches, kindDevice, res)
	if floor.has != [3]bool{true, true, true} || plugin.has != [3]bool{true, true, true} {
		return Row{}, false
	}
	floorMet, pluginMet := floor.met(), plugin.met()
	var figures, both, pluginOnly []string
	nFloor, nPlugin := 0, 0
	for i, name := range targetNames {
		format := "%s %.2f×"
		if i == 2 {
			format = "%s %.2f"
		}
		verdict := "met"
		if !floorMet[i] {
			verdict = "missed"
		}
		figures = append(figures, fmt.Sprintf(format+" (%s)", name, floor.ratio[i], verdict))
		if floorMet[i] {
			nFloor++
		}
		switch {
		case pluginMet[i]:
			nPlugin++
		case !floorMet[i]:
			both = append(both, name)
		default:
			pluginOnly = append(pluginOnly, name)
		}
	}
	note := fmt.Sprintf("the floor control against the null control, as the plugin is judged (null-judged rows): %s. "+
		"The floor does one zfs create and one zfs destroy a job and nothing else: a target it misses was out of that work's reach in this run. "+
		"The plugin's misses the floor shares: %s; the plugin's alone: %s",
		strings.Join(figures, ", "), namesOrNone(both), namesOrNone(pluginOnly))
	return Row{Key: "floor-reach", Figure: "issue 46's three targets against the null control: met by the floor control, and by the plugin",
		Measured: fmt.Sprintf("%d of 3 floor", nFloor), Reference: fmt.Sprintf("%d of 3 plugin", nPlugin), Value: float64(nFloor),
		Target: "—", Verdict: "info", Note: note}, true
}

// namesOrNone joins names, or says "none".
func namesOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
