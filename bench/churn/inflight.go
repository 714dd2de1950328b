package churn

// The plugin's zfs commands beside its Reserves: how much slower a Reserve
// after a batch's first wave is when one of the plugin's zfs or zpool
// commands (on any slot: a release, a spare, an owner's record) is running
// at the same moment. The Reserves with none in flight are the control
// within the same batches: the same jobs, the same agent, the same second.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// cmdSpan is one zfs or zpool command the plugin ran, from its runner's
// "ran" line: when it began and ended, and what it was ("set canmount",
// "rename", ...).
type cmdSpan struct {
	Start, End time.Time
	What       string
}

// commandSpan reads a runner's "ran" line (any command, any outcome): it
// ends at the line's time, and began its duration before; what it was is
// its subcommand, with the property a set sets (ranArgs), or the command
// when no args were logged.
func commandSpan(l logLine) (cmdSpan, bool) {
	took, ok := logDuration(l.KV["duration"])
	if !ok || took < 0 || l.At.IsZero() {
		return cmdSpan{}, false
	}
	what := l.KV["cmd"]
	if args, ok := ranArgs(l); ok && args[0] != "" {
		what = args[0]
		if args[0] == "set" && len(args) > 1 {
			prop, _, _ := strings.Cut(args[1], "=")
			what += " " + prop
		}
	}
	return cmdSpan{Start: l.At.Add(-took), End: l.At, What: what}, true
}

// inFlight returns what the commands running at some moment strictly
// between start and end were, sorted: a command that ended at start or
// began at end is not one of them, and a hook of no length has only the
// commands that began before it and ended after it.
func inFlight(cmds []cmdSpan, start, end time.Time) []string {
	var out []string
	for _, c := range cmds {
		if c.Start.Before(end) && start.Before(c.End) {
			out = append(out, c.What)
		}
	}
	slices.Sort(out)
	return out
}

// inFlightRow is the plugin's Reserves after its device batches' first
// waves, split by whether one of its commands was in flight meanwhile:
// the p50 of each part, and the control's after-wave p50 beside them. A
// Reserve not prepared at placement is left out: it does work of its own
// on its slot (a zfs set, a wait for its slot's release), and that work
// is no neighbour. False when either part has no sample.
func inFlightRow(res *Results) (Row, bool) {
	var busy, none []time.Duration
	mine := 0
	kinds := map[string]int{} // what was in flight beside the busy ones
	for _, b := range ofKind(res.Batches, kindDevice) {
		first := firstWave(b, res.Slots)
		for _, a := range b.Allocs {
			switch {
			case a.ReserveMS <= 0 || first[a.AllocID]:
			case !a.Prepared:
				mine++
			case len(a.ZFSInFlight) == 0:
				none = append(none, msDur(a.ReserveMS))
			default:
				busy = append(busy, msDur(a.ReserveMS))
				for _, k := range a.ZFSInFlight {
					kinds[k]++
				}
			}
		}
	}
	if len(busy) == 0 || len(none) == 0 {
		return Row{}, false
	}
	var byKind []string
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		byKind = append(byKind, fmt.Sprintf("%s %d", k, kinds[k]))
	}
	b, n := bench.Median(busy), bench.Median(none)
	q := float64(b) / float64(n)
	note := fmt.Sprintf("the devices hook of the plugin's tasks after each device batch's first wave: %d of %d had at least one of the plugin's zfs or zpool commands (any slot's) running at some moment of it (%d more were not prepared at placement, did work of their own on their slot, and are left out). Those without are the control within the same batches. A longer hook is likelier to meet a command, so the split leans the slow ones to the busy side a little (the commands run 50-600 ms, the hooks a few). Beside the busy ones, by kind: %s",
		len(busy), len(busy)+len(none), mine, strings.Join(byKind, ", "))
	if _, nullRest := waveSplit(res.Null, res.Slots, reserveMS); len(nullRest) > 0 {
		c := bench.Median(nullRest)
		note += fmt.Sprintf("; against the null device's after-wave p50 %s they read %.2f× (with a command in flight) and %.2f× (without)", fmtMS(c), float64(b)/float64(c), float64(n)/float64(c))
	}
	return Row{Key: "zfs-in-flight-rest",
		Figure:   "Reserve after the first wave with one of the plugin's zfs commands running meanwhile, against with none, p50",
		Measured: fmtMS(b) + " in flight", Reference: fmtMS(n) + " none", Ratio: fmt.Sprintf("%.2f×", q), Value: q,
		Target: "—", Verdict: "info", Note: note}, true
}
