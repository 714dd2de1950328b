package bench

import (
	"fmt"
	"strings"
	"time"
)

// The rows of the size table: a measure against its floor, and how it is
// judged.

func (h *sizeRun) addTimeRow(key, measure string, ps, fs []time.Duration, note string, judge func(Row, bool) string) {
	row := timeRow(key, measure, Median(ps), Median(fs), ps, fs, "≤ 1.2× floor at the largest size", note, judge)
	// On a busy machine the floor itself drifts by tens of percent over a
	// run; the ratio within each interleaved pair does not, so the row's
	// ratio is the median of the pairs' ratios.
	row.RatioOfMedians, row.Ratio = row.Ratio, pairedRatio(ps, fs)
	h.rows = append(h.rows, row)
}

// pairedRatio is the median of plugin[i]/floor[i] over the pairs.
func pairedRatio(ps, fs []time.Duration) *float64 {
	var ratios []time.Duration // in units of 1e-6, to reuse Median
	for i := range min(len(ps), len(fs)) {
		if fs[i] > 0 {
			ratios = append(ratios, time.Duration(float64(ps[i])/float64(fs[i])*1e6))
		}
	}
	if len(ratios) == 0 {
		return nil
	}
	r := round2(float64(Median(ratios)) / 1e6)
	return &r
}

func timeRow(key, measure string, plugin, floor time.Duration, ps, fs []time.Duration, target, note string, judge func(Row, bool) string) Row {
	f := Millis(floor)
	var ratio *float64
	if floor > 0 {
		r := round2(float64(plugin) / float64(floor))
		ratio = &r
	}
	return Row{Key: key, Measure: measure, Unit: "ms", Plugin: Millis(plugin), Floor: &f, Ratio: ratio, Target: target,
		Note: note, PluginSamples: msAll(ps), FloorSamples: msAll(fs), judge: judge}
}

// addCountRow reports the largest count seen, and every count in the note.
// ok judges each call; a row without ok is for information.
func (h *sizeRun) addCountRow(key, measure string, seen []Counts, floor Counts, target string, ok func(Counts) bool) {
	worst := Counts{}
	samples := make([]float64, 0, len(seen))
	all := make([]string, 0, len(seen))
	verdict := "info"
	if ok != nil {
		verdict = "pass"
	}
	for _, c := range seen {
		if c.Total() >= worst.Total() {
			worst = c
		}
		samples = append(samples, float64(c.Total()))
		all = append(all, c.String())
		if ok != nil && !ok(c) {
			verdict = "miss"
		}
	}
	f := float64(floor.Total())
	var ratio *float64 // none when the floor is no process at all
	if f > 0 {
		r := round2(float64(worst.Total()) / f)
		ratio = &r
	}
	h.rows = append(h.rows, Row{Key: key, Measure: measure, Unit: "processes", Plugin: float64(worst.Total()), Floor: &f, Ratio: ratio,
		Target: target, PluginSamples: samples,
		Note:  fmt.Sprintf("counting wrapper, %d calls: %s", len(seen), strings.Join(uniq(all), " | ")),
		judge: func(Row, bool) string { return verdict }})
}

func exactly(want Counts) func(Counts) bool {
	return func(c Counts) bool { return c.String() == want.String() }
}

func ratioAtLargest(limit float64) func(Row, bool) string {
	return func(r Row, largest bool) string {
		if !largest {
			return "info"
		}
		return PassIf(r.Ratio != nil && *r.Ratio <= limit)
	}
}

func ratioMax(limit float64) func(Row, bool) string {
	return func(r Row, _ bool) string { return PassIf(r.Ratio != nil && *r.Ratio <= limit) }
}

// PassIf is the verdict "pass" when ok, else "miss".
func PassIf(ok bool) string {
	if ok {
		return "pass"
	}
	return "miss"
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

func uniq(ss []string) []string {
	var out []string
	seen := map[string]int{}
	for _, s := range ss {
		if _, ok := seen[s]; !ok {
			seen[s] = len(out)
			out = append(out, s)
		}
	}
	return out
}
