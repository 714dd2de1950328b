package churn

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The turns of a batch pair each placement after the first slots ones with
// the end that freed its place, in time order, whatever order the records
// come in; records missing a time are left out.
func TestTurnParts(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	rec := func(placed, started, terminal int) AllocRecord {
		return AllocRecord{Placed: ms(placed), Started: ms(started), Terminal: ms(terminal)}
	}
	for _, tc := range []struct {
		name            string
		allocs          []AllocRecord
		slots           int
		toPlaced, start []time.Duration
	}{
		{
			name: "two slots, two turns",
			// placed at 0 and 0 (one plan), ended at 1000 and 1200; the
			// next two placed at 1300 and 1250, started 100 and 60 ms later.
			allocs:   []AllocRecord{rec(0, 50, 1000), rec(0, 40, 1200), rec(1300, 1400, 2400), rec(1250, 1310, 2300)},
			slots:    2,
			toPlaced: []time.Duration{250 * time.Millisecond, 100 * time.Millisecond},
			start:    []time.Duration{60 * time.Millisecond, 100 * time.Millisecond},
		},
		{
			name:   "no turn: no more allocations than slots",
			allocs: []AllocRecord{rec(0, 50, 1000), rec(10, 40, 1200)},
			slots:  2,
		},
		{
			// X never started (its Reserve failed, say) but held the
			// place until it ended at 1500: C waited 100 ms for it, not
			// 600 ms for A.
			name:     "an allocation that never started holds its place and gives no sample",
			allocs:   []AllocRecord{rec(0, 50, 1000), {Placed: ms(1010), Terminal: ms(1500)}, rec(1600, 1650, 2600)},
			slots:    1,
			toPlaced: []time.Duration{100 * time.Millisecond},
			start:    []time.Duration{50 * time.Millisecond},
		},
		{
			name:   "a placement before the end it is paired with gives no sample",
			allocs: []AllocRecord{rec(0, 50, 1000), rec(900, 1100, 2000)},
			slots:  1,
		},
		{
			name:   "no placement time (an older record): left out",
			allocs: []AllocRecord{{Started: ms(50), Terminal: ms(1000)}, {Started: ms(1100), Terminal: ms(2000)}},
			slots:  1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toPlaced, start := turnParts(tc.allocs, tc.slots)
			must.Eq(t, tc.toPlaced, toPlaced)
			must.Eq(t, tc.start, start)
		})
	}
}

// The row compares device turns with baseline turns, and is left out when
// either kind has none.
func TestTurnRow(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	batch := func(kind string, gap, start int) BatchResult {
		return BatchResult{Kind: kind, Allocs: []AllocRecord{
			{Placed: ms(0), Started: ms(start), Terminal: ms(1000)},
			{Placed: ms(1000 + gap), Started: ms(1000 + gap + start), Terminal: ms(2000 + gap)},
		}}
	}
	row, ok := turnRow([]BatchResult{batch("baseline", 200, 50), batch("device", 300, 120)}, 1)
	must.True(t, ok)
	must.Eq(t, "turn", row.Key)
	must.Eq(t, "300 ms + 120 ms", row.Measured)
	must.Eq(t, "200 ms + 50.0 ms baseline", row.Reference)
	_, ok = turnRow([]BatchResult{batch("device", 300, 120)}, 1)
	must.False(t, ok)
}

// The part of a Reserve outside the plugin is the hook less the plugin's
// own time, for fresh and spare Reserves during churn against idle ones;
// a Reserve given a slot still being released does not count, and the row
// is left out without idle samples.
func TestReserveOutsideRow(t *testing.T) {
	idle := []AllocRecord{{ReserveMS: 14, ReservePluginMS: 13, ReserveZFSMS: 11, Fresh: true}}
	batch := BatchResult{Kind: "device", Allocs: []AllocRecord{
		{ReserveMS: 60, ReservePluginMS: 57, Fresh: true},
		{ReserveMS: 40, ReservePluginMS: 35, How: "spare"},
		{ReserveMS: 50, ReservePluginMS: 48, How: "spare"},
		{ReserveMS: 900, ReservePluginMS: 100, How: "owner"}, // waited for a release
	}}
	row := func(res *Results) (Row, bool) {
		for _, r := range churnRows(res) {
			if r.Key == "reserve-outside" {
				return r, true
			}
		}
		return Row{}, false
	}
	got, ok := row(&Results{Idle: idle, Batches: []BatchResult{batch}})
	must.True(t, ok)
	must.Eq(t, "3.0 ms", got.Measured)
	must.Eq(t, "1.0 ms idle", got.Reference)
	must.Eq(t, "3.00×", got.Ratio)
	must.StrContains(t, got.Note, "p50 48.0 ms during churn, 13.0 ms idle")
	must.StrContains(t, got.Note, "alone it is 0.21× the whole idle Reserve")
	_, ok = row(&Results{Batches: []BatchResult{batch}})
	must.False(t, ok)

	// The fresh row splits its own Reserves the same way (the one fresh
	// Reserve: 57 ms in the plugin, 3 ms outside, 3/14 of the idle one).
	var fresh Row
	for _, r := range churnRows(&Results{Idle: idle, Batches: []BatchResult{batch}}) {
		if r.Key == "reserve-fresh" {
			fresh = r
		}
	}
	must.StrContains(t, fresh.Note, "of these fresh Reserves (1 with both parts), p50: in the plugin 57.0 ms, outside it 3.0 ms, which alone is 0.21× the whole idle Reserve")
}

// A Reserve counts the others that overlapped it in time, whatever their
// order; a record without a Reserve counts for none and gets -1.
func TestReservesBeside(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	res := func(start, took int) AllocRecord {
		return AllocRecord{ReserveStart: t0.Add(time.Duration(start) * time.Millisecond), ReserveMS: float64(took)}
	}
	for _, tc := range []struct {
		name   string
		allocs []AllocRecord
		want   []int
	}{
		{
			name:   "a wave of three and one alone",
			allocs: []AllocRecord{res(0, 50), res(1000, 20), res(10, 30), res(45, 10)},
			// 0–50 meets 10–40 and 45–55; 10–40 ends before 45.
			want: []int{2, 0, 1, 1},
		},
		{
			name:   "back to back is not beside",
			allocs: []AllocRecord{res(0, 50), res(50, 50)},
			want:   []int{0, 0},
		},
		{
			name:   "no Reserve",
			allocs: []AllocRecord{{}, res(0, 50), {ReserveStart: t0}},
			want:   []int{-1, 0, -1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, reservesBeside(tc.allocs))
		})
	}
}

// The note names each group that has samples, with its median and count,
// and nothing when no group has any.
func TestBesideNote(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	must.Eq(t, "", besideNote([4][]time.Duration{}))
	must.Eq(t, "; that zfs set by the other slots' Reserves running at the same time: beside no other Reserve p50 19.0 ms (3), beside 3 or more other Reserves p50 35.0 ms (2)",
		besideNote([4][]time.Duration{{ms(18), ms(19), ms(40)}, nil, nil, {ms(30), ms(40)}}))
}

// The prepared row counts the device batches' Reserves handed over as
// prepared, splits them by whether the preparation had ended when the
// Reserve arrived, and leaves out batches' records without a Reserve.
func TestPreparedRows(t *testing.T) {
	idle := []AllocRecord{{ReserveMS: 4, ReservePluginMS: 2, Prepared: true, PrepLeadMS: 150, PrepMS: 20}}
	batch := BatchResult{Kind: "device", Allocs: []AllocRecord{
		{ReserveMS: 10, ReservePluginMS: 4, Prepared: true, PrepLeadMS: 30, PrepMS: 300},
		{ReserveMS: 12, ReservePluginMS: 6, Prepared: true, PrepLeadMS: 10, PrepMS: 320},
		{ReserveMS: 90, ReservePluginMS: 80, Prepared: true, PrepLeadMS: -70, PrepMS: 400},
		{ReserveMS: 200, ReservePluginMS: 190, How: "spare"},
		{Job: "no Reserve"},
	}}
	rows := preparedRows(&Results{Idle: idle, Batches: []BatchResult{batch}})
	must.SliceLen(t, 1, rows)
	must.Eq(t, "3 of 4", rows[0].Measured)
	must.Eq(t, "2 ready when asked", rows[0].Reference)
	must.StrContains(t, rows[0].Note, "ready 5.0 ms (2), waited for the preparation 80.0 ms (1, the wait p50 70.0 ms), idle 2.0 ms (1)")
	must.StrContains(t, rows[0].Note, "zfs work p50 320 ms, ended p50 10.0 ms before")
	must.SliceEmpty(t, preparedRows(&Results{Idle: idle}))
}
