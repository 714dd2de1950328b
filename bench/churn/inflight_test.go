package churn

import (
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// Every command the plugin's runner logged is read as a span ending at the
// line's time, whatever its outcome; a devices hook counts the spans that
// overlap it. The lines are from a churn run's agent log (2026-12-06): the
// hook ran 22:19:51.126-.153, beside the fate of another slot's dataset
// (22:19:51.135-.473); the pool's list ran long before it and the unmount
// of the hook's own slot's old dataset after it.
func TestCommandSpans(t *testing.T) {
	const log = `    2026-12-06T22:19:03.169Z [TRACE] agent.plugin_loader.nomad-device-zfs: ran: plugin_dir=/tmp/zfsbench-129518494/churn/plugins args=[list, -H, -o, name] cmd=zpool error=<nil> gate_wait=0 yielded=0 @module=nomad-device-zfs.zfs duration="1.7292052e+07" timestamp=2026-12-06T22:19:03.169Z
    2026-12-06T22:19:51.152Z [TRACE] client.alloc_runner.task_runner: finished prestart hook: alloc_id=ba2ed19b-e4dd-ceea-4890-121e25ed6404 task=t name=devices end="2026-12-06 22:19:51.152567059 +0000 UTC m=+48.391515839" duration=26.328279ms
    2026-12-06T22:19:51.473Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs args=[set, nomad-device-zfs:state=archived, zbench020218b2/nomad/scratch/0.alt] cmd=zfs duration="3.38006553e+08" gate_wait=0 yielded=0 @module=nomad-device-zfs.zfs error=<nil> timestamp=2026-12-06T22:19:51.473Z
    2026-12-06T22:19:51.502Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs args=[set, canmount=off, zbench020218b2/nomad/scratch/1] cmd=zfs duration="1.78618124e+08" yielded=0 @module=nomad-device-zfs.zfs error=<nil> gate_wait=126119 timestamp=2026-12-06T22:19:51.500Z
    2026-12-06T22:19:51.554Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs cmd=zfs yielded=0 args=[rename, zbench020218b2/nomad/scratch/1, zbench020218b2/nomad/.archive/scratch-1.x] duration="5.3796297e+07" error="exit status 1" @module=nomad-device-zfs.zfs timestamp=2026-12-06T22:19:51.554Z
    2026-12-06T22:19:51.600Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs cmd=zfs args=[rename, a, b] duration=bad @module=nomad-device-zfs.zfs timestamp=2026-12-06T22:19:51.600Z
`
	lg, err := readChurnLog(strings.NewReader(log), "zbench020218b2/nomad", "scratch")
	must.NoError(t, err)
	var what []string
	for _, c := range lg.Commands {
		what = append(what, c.What)
		must.Eq(t, c.End.Sub(c.Start), c.End.Sub(c.Start).Abs(), must.Sprint("a span runs forward: ", c))
	}
	// The line whose duration cannot be read is left out.
	must.Eq(t, []string{"list", "set nomad-device-zfs:state", "set canmount", "rename"}, what)
	must.Eq(t, 338006553*time.Nanosecond, lg.Commands[1].End.Sub(lg.Commands[1].Start))
	h, ok := lg.Hooks["ba2ed19b-e4dd-ceea-4890-121e25ed6404"]
	must.True(t, ok)
	must.Eq(t, 1, inFlight(lg.Commands, h.Start, h.Start.Add(h.Duration)))
}

func TestInFlight(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := func(from, to int) cmdSpan { return cmdSpan{Start: at(from), End: at(to), What: "set"} }
	cases := []struct {
		name string
		cmds []cmdSpan
		want int
	}{
		{name: "none", want: 0},
		{name: "ended before", cmds: []cmdSpan{span(0, 99)}, want: 0},
		{name: "ended as the hook began", cmds: []cmdSpan{span(0, 100)}, want: 0},
		{name: "began as the hook ended", cmds: []cmdSpan{span(110, 200)}, want: 0},
		{name: "across its start", cmds: []cmdSpan{span(50, 101)}, want: 1},
		{name: "inside", cmds: []cmdSpan{span(102, 105)}, want: 1},
		{name: "across its end", cmds: []cmdSpan{span(109, 300)}, want: 1},
		{name: "around it", cmds: []cmdSpan{span(0, 300)}, want: 1},
		{name: "three of four", cmds: []cmdSpan{span(0, 300), span(0, 50), span(105, 106), span(109, 120)}, want: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, inFlight(tc.cmds, at(100), at(110)))
		})
	}
}

// The row splits the Reserves after each first wave (the first Slots
// placed are the wave) by whether a command was in flight, and names the
// control's after-wave p50 when the run had null batches.
func TestInFlightRow(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	batch := func(kind string, ms []float64, inflight []int) BatchResult {
		b := nullBatch(kind, t0, ms, nil)
		for i := range b.Allocs {
			b.Allocs[i].ZFSInFlight = inflight[i]
		}
		return b
	}
	// First wave (2 slots): 50 and 60 ms, left out. After it: 4, 6, 8 ms
	// with a command in flight (p50 6), 2 and 3 ms without (p50 2.5).
	dev := batch(kindDevice, []float64{50, 60, 4, 2, 6, 3, 8}, []int{1, 0, 2, 0, 1, 0, 3})
	res := &Results{Slots: 2, Batches: []BatchResult{batch(kindBaseline, []float64{0, 0, 0}, []int{0, 0, 0}), dev},
		Null: []BatchResult{nullBatch(kindNull, t0, []float64{9, 9, 2, 2, 2}, nil)}}
	row, ok := inFlightRow(res)
	must.True(t, ok)
	must.Eq(t, "zfs-in-flight-rest", row.Key)
	must.Eq(t, "info", row.Verdict)
	must.Eq(t, 6.0/2.5, row.Value, must.Sprint(row)) // the median of two is their mean
	must.StrContains(t, row.Note, "3 of 5 had")
	must.StrContains(t, row.Note, "3.00× (with a command in flight) and 1.25× (without)")

	// Without null batches: no control in the note.
	res.Null = nil
	row, ok = inFlightRow(res)
	must.True(t, ok)
	must.StrNotContains(t, row.Note, "null device")

	// Every Reserve with a command in flight: no row.
	all := batch(kindDevice, []float64{50, 60, 4, 2}, []int{1, 1, 1, 1})
	_, ok = inFlightRow(&Results{Slots: 2, Batches: []BatchResult{all}})
	must.False(t, ok)
}
