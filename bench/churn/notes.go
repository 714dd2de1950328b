package churn

// Notes of the churn table's Reserve rows: what the Reserves waited for
// and what ran beside them.

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// lockWaitsNote describes the Reserves' waits for their slot's lock
// (TRACE "waited for the slot's lock", a millisecond or more), by what
// held it.
func lockWaitsNote(waits []logLockWait) string {
	if len(waits) == 0 {
		return "; no Reserve waited a millisecond or more for its slot's lock"
	}
	var all []time.Duration
	behind := map[string]int{}
	for _, w := range waits {
		all = append(all, w.Waited)
		behind[orNone(w.Behind)]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(behind)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, behind[k]))
	}
	return fmt.Sprintf("; %d Reserves waited a millisecond or more for their slot's lock (p50 %s, max %s), behind: %s",
		len(waits), fmtMS(bench.Median(all)), fmtMS(bench.Percentile(all, 100)), strings.Join(parts, ", "))
}

func orNone(s string) string {
	if s == "" {
		return "(unnamed: the lock was being taken or given up)"
	}
	return s
}

// readsNote describes the plugin's non-blocking reads of the node's
// allocations during the batches: a Reserve's identification runs beside
// its zfs command and the Reserve returns when both are done.
func readsNote(reads []logRead) string {
	if len(reads) == 0 {
		return ""
	}
	var took []time.Duration
	most := 0
	for _, r := range reads {
		took = append(took, r.Took)
		most = max(most, r.Allocs)
	}
	return fmt.Sprintf("; the plugin's non-blocking reads of the node's allocations during the batches (a Reserve's identification, a release pass's proof): %d, p50 %s, p90 %s, at up to %d allocations",
		len(reads), fmtMS(bench.Median(took)), fmtMS(bench.Percentile(took, 90)), most)
}

// reservesBeside returns, for each of allocs, how many of the others'
// Reserves (the client's "devices" hook) overlapped its own in time; -1
// for a record without one. The Reserves of a churn come in waves: the
// jobs of a batch end together, and their successors are placed and
// started together.
func reservesBeside(allocs []AllocRecord) []int {
	out := make([]int, len(allocs))
	end := func(a AllocRecord) time.Time { return a.ReserveStart.Add(msDur(a.ReserveMS)) }
	for i, a := range allocs {
		if a.ReserveStart.IsZero() || a.ReserveMS <= 0 {
			out[i] = -1
			continue
		}
		for j, o := range allocs {
			if j != i && !o.ReserveStart.IsZero() && o.ReserveMS > 0 && o.ReserveStart.Before(end(a)) && a.ReserveStart.Before(end(o)) {
				out[i]++
			}
		}
	}
	return out
}

// besideNote tells the zfs set of the churn's Reserves apart by how many
// other slots' Reserves ran beside each (byBeside[3]: 3 or more); "" when
// there is none.
func besideNote(byBeside [4][]time.Duration) string {
	var parts []string
	for n, d := range byBeside {
		if len(d) == 0 {
			continue
		}
		who := fmt.Sprintf("%d other Reserves", n)
		switch n {
		case 0:
			who = "no other Reserve"
		case 1:
			who = "1 other Reserve"
		case 3:
			who = "3 or more other Reserves"
		}
		parts = append(parts, fmt.Sprintf("beside %s p50 %s (%d)", who, fmtMS(bench.Median(d)), len(d)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; that zfs set by the other slots' Reserves running at the same time: " + strings.Join(parts, ", ")
}

// freshPartsNote splits the fresh Reserves during churn into the plugin's
// own time and the part outside it (gRPC, the Nomad client saving the
// answer), and gives the outside part against the whole idle Reserve: the
// least the fresh row's ratio could be if the plugin took no time.
func freshPartsNote(in, out []time.Duration, idle time.Duration) string {
	if len(in) == 0 || len(out) == 0 || idle <= 0 {
		return ""
	}
	return fmt.Sprintf("; of these fresh Reserves (%d with both parts), p50: in the plugin %s, outside it %s, which alone is %.2f× the whole idle Reserve, the least this row could be if the plugin took no time",
		len(out), fmtMS(bench.Median(in)), fmtMS(bench.Median(out)), float64(bench.Median(out))/float64(idle))
}
