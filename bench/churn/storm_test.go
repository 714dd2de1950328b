package churn

import (
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The client's logmon hook is read by allocation, beside the devices hook.
func TestChurnLogLaunches(t *testing.T) {
	const log = `    2026-12-01T19:09:52.850Z [TRACE] client.alloc_runner.task_runner: finished prestart hook: alloc_id=e0dbd60f-2fe4-ecf1-0b26-2a1b4d62490e task=t name=logmon end="2026-12-01 19:09:52.850 +0000 UTC m=+1.79" duration=51.712345ms
    2026-12-01T19:09:52.861Z [TRACE] client.alloc_runner.task_runner: finished prestart hook: alloc_id=e0dbd60f-2fe4-ecf1-0b26-2a1b4d62490e task=t name=devices end="2026-12-01 19:09:52.861 +0000 UTC m=+1.80" duration=1.16ms
    2026-12-01T19:09:52.862Z [TRACE] client.alloc_runner.task_runner: finished prestart hook: alloc_id=e0dbd60f-2fe4-ecf1-0b26-2a1b4d62490e task=t name=dispatch_payload end="2026-12-01 19:09:52.862 +0000 UTC m=+1.80" duration="30.1µs"
`
	lg, err := readChurnLog(strings.NewReader(log), "p/nomad", "scratch")
	must.NoError(t, err)
	must.MapLen(t, 1, lg.Launches)
	must.Eq(t, 51712345*time.Nanosecond, lg.Launches["e0dbd60f-2fe4-ecf1-0b26-2a1b4d62490e"])
	must.Eq(t, 1160*time.Microsecond, lg.Hooks["e0dbd60f-2fe4-ecf1-0b26-2a1b4d62490e"].Duration)
}

// stormBatch is a batch whose allocation i was placed at t0 + placed[i]
// with a logmon hook of logmon[i] ms; the first two of fresh[i] are fresh
// Reserves (device batches).
func stormBatch(kind string, t0 time.Time, placed []time.Duration, logmon []float64, fresh []bool) BatchResult {
	b := BatchResult{Kind: kind}
	for i := range placed {
		a := AllocRecord{Job: kind + string(rune('a'+i)), AllocID: kind + "-" + string(rune('a'+i)), Placed: t0.Add(placed[i]), LogmonMS: logmon[i]}
		if kind == "device" {
			a.ReserveMS, a.Fresh = 2, fresh[i]
		}
		b.Allocs = append(b.Allocs, a)
	}
	return b
}

func TestFirstWave(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 19, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		placed []time.Duration
		n      int
		want   []string // IDs in the wave
	}{
		{name: "by create time, whatever the order of the list", placed: []time.Duration{3 * time.Second, 0, time.Second, 2 * time.Second}, n: 2, want: []string{"x-b", "x-c"}},
		{name: "ties go by job name", placed: []time.Duration{0, 0, 0}, n: 2, want: []string{"x-a", "x-b"}},
		{name: "a wave larger than the batch takes it all", placed: []time.Duration{0, time.Second}, n: 4, want: []string{"x-a", "x-b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := stormBatch("x", t0, tc.placed, make([]float64, len(tc.placed)), nil)
			got := firstWave(b, tc.n)
			must.MapLen(t, len(tc.want), got)
			for _, id := range tc.want {
				must.True(t, got[id], must.Sprintf("%s in the wave", id))
			}
		})
	}
}

func TestStormRow(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 19, 0, 0, 0, time.UTC)
	at := []time.Duration{0, 0, time.Second, 2 * time.Second, 3 * time.Second}
	base := stormBatch("baseline", t0, at, []float64{120, 140, 60, 50, 70}, nil)
	dev := stormBatch("device", t0.Add(time.Minute), at, []float64{200, 180, 80, 90, 100}, []bool{true, true, false, true, false})
	res := &Results{Slots: 2, Batches: []BatchResult{base, dev}}

	row, ok := stormRow(res)
	must.True(t, ok)
	must.Eq(t, "190 ms device", row.Measured)
	must.Eq(t, "130 ms baseline", row.Reference)
	must.Eq(t, "2.11× and 2.17× the rest", row.Ratio)
	must.Eq(t, "info", row.Verdict)
	must.StrContains(t, row.Note, "device first 190 ms (2), rest 90.0 ms (3); baseline first 130 ms (2), rest 60.0 ms (3)")

	// Two of the three fresh Reserves are their batch's first wave.
	must.Eq(t, "; 2 of these 3 are their batch's first 2 tasks, started together (launch-storm row)", freshWaveNote(res))

	// Without a timed hook on either side there is no row.
	for i := range res.Batches[0].Allocs {
		res.Batches[0].Allocs[i].LogmonMS = 0
	}
	_, ok = stormRow(res)
	must.False(t, ok)
	must.Eq(t, "", freshWaveNote(&Results{Slots: 2, Batches: []BatchResult{base}}))
}
