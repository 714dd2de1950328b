package churn

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// The plugin judged against the floor control at the same moments, with
// the targets, and the floor against the null control.
func TestFloorRows(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 2, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name                  string
		device, floor, null   []float64 // devices hooks, ms; the first 2 are the first wave
		devSec, flSec, nulSec float64
		ratios                [6]string
		verdicts              [3]string
	}{
		{"within the floor", []float64{6, 4, 2, 2}, []float64{4, 4, 2, 2}, []float64{2, 2, 1, 1}, 10, 10.4, 8,
			[6]string{"1.25×", "1.00×", "1.04", "2.00×", "2.00×", "0.77"}, [3]string{"pass", "pass", "pass"}},
		{"over it", []float64{30, 10, 3, 3}, []float64{4, 2, 2, 1}, []float64{2, 2, 1, 1}, 12.5, 10, 10,
			[6]string{"6.67×", "2.00×", "0.80", "1.50×", "1.50×", "1.00"}, [3]string{"miss", "miss", "miss"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &Results{Slots: 2,
				Batches: []BatchResult{nullBatch(kindDevice, t0, tc.device, nil)},
				Floor:   []BatchResult{nullBatch(kindFloor, t0, tc.floor, nil)},
				Null:    []BatchResult{nullBatch(kindNull, t0, tc.null, nil)},
			}
			res.Batches[0].Seconds, res.Floor[0].Seconds, res.Null[0].Seconds = tc.devSec, tc.flSec, tc.nulSec
			rows := floorRows(res)
			must.SliceLen(t, 6, rows, must.Sprint("no counts: no row of them"))
			for i, key := range []string{"floor-judged-wave", "floor-judged-rest", "floor-judged-throughput", "floor-null-wave", "floor-null-rest", "floor-null-throughput"} {
				must.Eq(t, key, rows[i].Key)
				must.Eq(t, tc.ratios[i], rows[i].Ratio, must.Sprint(key))
				if i < 3 {
					must.Eq(t, tc.verdicts[i], rows[i].Verdict, must.Sprint(key))
				} else {
					must.Eq(t, "info", rows[i].Verdict, must.Sprint(key))
				}
			}
			must.Eq(t, "≤ 1.5× the floor", rows[0].Target)
			must.Eq(t, "≥ 0.95", rows[2].Target)
		})
	}
	// No floor batch: no floor rows.
	must.SliceEmpty(t, floorRows(&Results{Slots: 2, Batches: []BatchResult{nullBatch(kindDevice, t0, []float64{1, 1, 1}, nil)}}))
}

// The zfs processes per job, by command, net of the baseline batches'
// rate of each command over the same windows.
func TestNetPerJob(t *testing.T) {
	batch := func(kind string, jobs int, secs float64, c bench.Counts) BatchResult {
		return BatchResult{Kind: kind, WindowSeconds: secs, Allocs: make([]AllocRecord, jobs), ZFSCounts: c}
	}
	for _, tc := range []struct {
		name    string
		batches []BatchResult
		kind    string
		want    map[string]float64
		total   float64
		ok      bool
	}{
		{name: "the refreshes taken out",
			batches: []BatchResult{
				batch(kindBaseline, 40, 20, bench.Counts{"zfs get -r": 10, "zpool list": 4}),
				batch(kindDevice, 40, 40, bench.Counts{"zfs get -r": 20, "zpool list": 8, "zfs set": 80, "zfs create": 40}),
				batch(kindFloor, 40, 20, bench.Counts{"zfs get -r": 10, "zpool list": 4, "zfs create": 40, "zfs destroy": 40}),
			},
			kind: kindDevice, want: map[string]float64{"zfs get -r": 0, "zpool list": 0, "zfs set": 2, "zfs create": 1}, total: 3, ok: true},
		{name: "the floor's",
			batches: []BatchResult{
				batch(kindBaseline, 40, 20, bench.Counts{"zfs get -r": 10}),
				batch(kindFloor, 40, 20, bench.Counts{"zfs get -r": 10, "zfs create": 40, "zfs destroy": 40}),
				batch(kindFloor, 40, 40, bench.Counts{"zfs get -r": 20, "zfs create": 40, "zfs destroy": 40}),
			},
			kind: kindFloor, want: map[string]float64{"zfs get -r": 0, "zfs create": 1, "zfs destroy": 1}, total: 2, ok: true},
		{name: "no baseline", batches: []BatchResult{batch(kindFloor, 40, 20, bench.Counts{"zfs create": 40})}, kind: kindFloor},
		{name: "no job of the kind", batches: []BatchResult{batch(kindBaseline, 40, 20, nil)}, kind: kindFloor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, total, ok := netPerJob(tc.batches, tc.kind)
			must.Eq(t, tc.ok, ok)
			must.Eq(t, tc.want, got)
			must.Eq(t, tc.total, total)
		})
	}
	must.Eq(t, "2.00 zfs set, 1.00 zfs create", perJobString(map[string]float64{"zfs set": 2, "zfs create": 1, "zfs get -r": 0.01}))
	must.Eq(t, "none", perJobString(nil))
}
