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
	must.Eq(t, []string{"set nomad-device-zfs:state"}, inFlight(lg.Commands, h.Start, h.Start.Add(h.Duration)))
}

func TestInFlight(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := func(from, to int, what string) cmdSpan { return cmdSpan{Start: at(from), End: at(to), What: what} }
	cases := []struct {
		name     string
		cmds     []cmdSpan
		from, to int // the hook
		want     []string
	}{
		{name: "none", from: 100, to: 110},
		{name: "ended before", cmds: []cmdSpan{span(0, 99, "set")}, from: 100, to: 110},
		{name: "ended as the hook began", cmds: []cmdSpan{span(0, 100, "set")}, from: 100, to: 110},
		{name: "began as the hook ended", cmds: []cmdSpan{span(110, 200, "set")}, from: 100, to: 110},
		{name: "across its start", cmds: []cmdSpan{span(50, 101, "set")}, from: 100, to: 110, want: []string{"set"}},
		{name: "inside", cmds: []cmdSpan{span(102, 105, "rename")}, from: 100, to: 110, want: []string{"rename"}},
		{name: "across its end", cmds: []cmdSpan{span(109, 300, "create")}, from: 100, to: 110, want: []string{"create"}},
		{name: "around it", cmds: []cmdSpan{span(0, 300, "get")}, from: 100, to: 110, want: []string{"get"}},
		{name: "a command of no length inside", cmds: []cmdSpan{span(105, 105, "list")}, from: 100, to: 110, want: []string{"list"}},
		{name: "a hook of no length: only what spans it", cmds: []cmdSpan{span(0, 300, "get"), span(100, 200, "set"), span(0, 100, "list")}, from: 100, to: 100, want: []string{"get"}},
		{name: "three of four, sorted", cmds: []cmdSpan{span(0, 300, "set b"), span(0, 50, "x"), span(105, 106, "rename"), span(109, 120, "set a")}, from: 100, to: 110,
			want: []string{"rename", "set a", "set b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, inFlight(tc.cmds, at(tc.from), at(tc.to)))
		})
	}
}

// The row splits the device batches' prepared Reserves after each first
// wave (the first Slots placed are the wave) by whether a command was in
// flight, leaves out the Reserves not prepared (they do work of their
// own), tallies what was in flight, and names the control's after-wave
// p50 when the run had null batches.
func TestInFlightRow(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 22, 0, 0, 0, time.UTC)
	batch := func(kind string, ms []float64, inflight [][]string) BatchResult {
		b := nullBatch(kind, t0, ms, nil)
		for i := range b.Allocs {
			b.Allocs[i].ZFSInFlight, b.Allocs[i].Prepared = inflight[i], true
		}
		return b
	}
	set, ren := "set nomad-device-zfs:state", "rename"
	// First wave (2 slots): 50 and 60 ms, left out. After it: 4, 6, 8 ms
	// with a command in flight (p50 6), 2 and 3 ms without (p50 2.5), 40
	// ms not prepared and 30 ms not prepared that ran a zfs set of its own
	// (both left out). The first wave's unprepared one is not counted as
	// left out.
	dev := batch(kindDevice, []float64{50, 60, 4, 2, 6, 3, 8, 40, 30},
		[][]string{{set}, nil, {set, set}, nil, {ren}, nil, {ren, set}, {set}, {set}})
	dev.Allocs[0].Prepared = false
	dev.Allocs[7].Prepared = false
	dev.Allocs[8].Prepared, dev.Allocs[8].ReserveZFSMS = false, 25
	// A baseline batch never has a devices hook; one that had would not
	// count.
	base := batch(kindBaseline, []float64{1, 1, 1, 1}, [][]string{nil, nil, nil, {set}})
	res := &Results{Slots: 2, Batches: []BatchResult{base, dev},
		Null: []BatchResult{nullBatch(kindNull, t0, []float64{9, 9, 2, 2, 2}, nil)}}
	row, ok := inFlightRow(res)
	must.True(t, ok)
	must.Eq(t, "zfs-in-flight-rest", row.Key)
	must.Eq(t, "info", row.Verdict)
	must.Eq(t, 6.0/2.5, row.Value, must.Sprint(row)) // the median of two is their mean
	must.StrContains(t, row.Note, "3 of 5 had")
	must.StrContains(t, row.Note, "(2 more were not prepared at placement")
	must.StrContains(t, row.Note, "by kind: rename 2, set nomad-device-zfs:state 3;")
	must.StrContains(t, row.Note, "3.00× (with a command in flight) and 1.25× (without)")

	// Without null batches: no control in the note.
	res.Null = nil
	row, ok = inFlightRow(res)
	must.True(t, ok)
	must.StrNotContains(t, row.Note, "null device")

	// Every Reserve with a command in flight: no row.
	all := batch(kindDevice, []float64{50, 60, 4, 2}, [][]string{{set}, {set}, {set}, {ren}})
	_, ok = inFlightRow(&Results{Slots: 2, Batches: []BatchResult{all}})
	must.False(t, ok)
}
