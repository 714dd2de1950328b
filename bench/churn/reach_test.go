package churn

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The floor control judged by issue 46's targets against the null control,
// and the plugin's misses split into those the floor shares and its own.
func TestReachRow(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	null := []float64{2, 2, 1, 1} // the first 2 are the first wave; 10 s
	for _, tc := range []struct {
		name          string
		floor, device []float64
		flSec, devSec float64
		measured, ref string
		figures       string
		shares, alone string
	}{
		{"the floor meets all three", []float64{2, 2, 1, 1}, []float64{2, 2, 3, 3}, 10, 12.5,
			"3 of 3 floor", "1 of 3 plugin",
			"first wave 1.00× (met), after the first wave 1.00× (met), throughput 1.00 (met)",
			"none", "after the first wave, throughput"},
		{"the floor misses all three", []float64{4, 4, 2, 2}, []float64{4, 4, 3, 3}, 12.5, 10,
			"0 of 3 floor", "1 of 3 plugin",
			"first wave 2.00× (missed), after the first wave 2.00× (missed), throughput 0.80 (missed)",
			"first wave, after the first wave", "none"},
		{"at the bounds", []float64{3, 3, 1, 1}, []float64{4, 4, 1, 1}, 10.5, 10.6,
			"3 of 3 floor", "1 of 3 plugin",
			"first wave 1.50× (met), after the first wave 1.00× (met), throughput 0.95 (met)",
			"none", "first wave, throughput"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &Results{Slots: 2,
				Batches: []BatchResult{nullBatch(kindBaseline, t0, []float64{0, 0, 0, 0}, nil), nullBatch(kindDevice, t0, tc.device, nil)},
				Floor:   []BatchResult{nullBatch(kindFloor, t0, tc.floor, nil)},
				Null:    []BatchResult{nullBatch(kindNull, t0, null, nil)},
			}
			res.Batches[1].Seconds, res.Floor[0].Seconds = tc.devSec, tc.flSec
			row, ok := reachRow(res)
			must.True(t, ok)
			// The same figures as the rows that print them.
			floor, plugin := judgeTargets(res.Floor, kindFloor, res), judgeTargets(res.Batches, kindDevice, res)
			printed := map[string]float64{}
			for _, r := range append(controlRows(res), floorRows(res)...) {
				printed[r.Key] = r.Value
			}
			for i, end := range []string{"wave", "rest", "throughput"} {
				must.Eq(t, printed["floor-null-"+end], floor.ratio[i], must.Sprint(end))
				must.Eq(t, printed["null-judged-"+end], plugin.ratio[i], must.Sprint(end))
			}
			must.Eq(t, "floor-reach", row.Key)
			must.Eq(t, tc.measured, row.Measured)
			must.Eq(t, tc.ref, row.Reference)
			must.Eq(t, "info", row.Verdict)
			must.StrContains(t, row.Note, tc.figures)
			must.StrContains(t, row.Note, "The plugin's misses the floor shares: "+tc.shares+"; the plugin's alone: "+tc.alone)
		})
	}

	// No row without both controls, or with a figure missing.
	device := nullBatch(kindDevice, t0, []float64{2, 2, 1, 1}, nil)
	for name, res := range map[string]*Results{
		"no floor":            {Slots: 2, Batches: []BatchResult{device}, Null: []BatchResult{nullBatch(kindNull, t0, null, nil)}},
		"no null":             {Slots: 2, Batches: []BatchResult{device}, Floor: []BatchResult{nullBatch(kindFloor, t0, null, nil)}},
		"no floor after-wave": {Slots: 2, Batches: []BatchResult{device}, Floor: []BatchResult{nullBatch(kindFloor, t0, []float64{2, 2}, nil)}, Null: []BatchResult{nullBatch(kindNull, t0, null, nil)}},
	} {
		_, ok := reachRow(res)
		must.False(t, ok, must.Sprint(name))
	}
}

// The bounds are the judged rows' (control.go): at the bound is met, past
// it is not, and a figure not computed is never met.
func TestTargetsMet(t *testing.T) {
	all := [3]bool{true, true, true}
	for _, tc := range []struct {
		name string
		in   targets
		want [3]bool
	}{
		{"at the bounds", targets{ratio: [3]float64{1.5, 1.5, 0.95}, has: all}, all},
		{"just past them", targets{ratio: [3]float64{1.5001, 1.5001, 0.9499}, has: all}, [3]bool{}},
		{"not computed", targets{ratio: [3]float64{1, 1, 1}, has: [3]bool{false, true, false}}, [3]bool{false, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, tc.in.met())
		})
	}
}
