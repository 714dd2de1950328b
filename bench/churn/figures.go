package churn

import (
	"slices"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
)

// ReleaseRecord is one release of a slot, as the plugin logged it and as
// the Nomad node API showed it.
type ReleaseRecord struct {
	Device string    `json:"device"`
	Job    string    `json:"job"`
	Start  time.Time `json:"start"` // plugin: "release started"
	Fresh  time.Time `json:"fresh"` // plugin: "slot changed" action "create slot", or Start with a spare
	// Spare: the slot's spare served from Start, so the slot never went
	// unhealthy (there is nothing for Nomad to show).
	Spare bool `json:"spare"`
	// AllocTerminal is the owner allocation's modify time once terminal.
	AllocTerminal time.Time `json:"alloc_terminal"`
	// RecycleMS runs from AllocTerminal to the first node API sample, at or
	// after Fresh, that shows the slot healthy; RecycleFromTaskMS from the
	// task's Terminated event instead.
	RecycleMS         float64 `json:"recycle_ms"`
	RecycleFromTaskMS float64 `json:"recycle_from_task_ms"`
	// ShownUnhealthy: a node API sample between Start and the next release
	// showed the slot unhealthy; UnhealthyDelayMS from Start to the first.
	ShownUnhealthy   bool    `json:"shown_unhealthy"`
	UnhealthyDelayMS float64 `json:"unhealthy_delay_ms,omitempty"`
	// HealthyAgainMS runs from Fresh to the first sample after it (and after
	// the unhealthy one) that shows the slot healthy.
	HealthyAgainMS float64 `json:"healthy_again_ms"`
	// SentUnhealthyMS runs from Start to the first fingerprint the plugin
	// sent showing the slot unhealthy (-1: none before the fresh dataset,
	// as when the slot was the class's last offered one);
	// SentHealthyMS from Fresh to the first showing it healthy again.
	SentUnhealthyMS float64 `json:"sent_unhealthy_ms"`
	SentHealthyMS   float64 `json:"sent_healthy_ms"`
	// OthersReleasing is how many other slots of the class had a release in
	// progress at Start; equal to slots−1, the slot was the class's last
	// offered one.
	OthersReleasing int `json:"others_releasing"`
}

// openReleases returns, sorted, the devices whose latest release logged at
// or before t has not ended by t (see the comment inside).
func openReleases(lg *churnLog, t time.Time) []string {
	last := map[string]logRelease{}
	for _, r := range lg.Releases {
		if !r.At.After(t) {
			last[r.Device] = r
		}
	}
	var open []string
	for dev, r := range last {
		// A release without a spare ends with the slot's fresh dataset; one
		// whose spare served at once ends when the old dataset is archived
		// or destroyed (no spare is made again while the slot is free).
		ends := lg.Fresh
		if r.Spare {
			ends = lg.Retired
		}
		if !slices.ContainsFunc(ends, func(e logEvent) bool {
			return e.Device == dev && !e.At.Before(r.At) && !e.At.After(t)
		}) {
			open = append(open, dev)
		}
	}
	slices.Sort(open)
	return open
}

// figures computes the table from the agent log, the node samples and the
// batches.
func (r *churnRun) figures() error {
	lg, err := r.readLog()
	if err != nil {
		return err
	}
	res := r.res
	samples := r.watch.snapshot()
	res.Health = r.watch.changes()
	res.Fingerprs = len(lg.Sent)
	inDevice := func(t time.Time) bool {
		return slices.ContainsFunc(res.Batches, func(b BatchResult) bool {
			return b.Kind == "device" && !t.Before(b.Start) && !t.After(b.End)
		})
	}
	for _, rd := range lg.Reads {
		if !rd.Blocking && inDevice(rd.End) {
			res.reads = append(res.reads, rd)
		}
	}
	for _, bs := range res.allBatches() {
		for i := range bs {
			bs[i].ListReads, bs[i].ListMost = listReads(lg.Reads, bs[i].Start, bs[i].Start.Add(time.Duration(bs[i].WindowSeconds*float64(time.Second))))
		}
	}
	for _, w := range lg.LockWaits {
		if (w.For == "reserve" || w.For == "hand over the spare") && inDevice(w.At) {
			res.lockWaits = append(res.lockWaits, w)
		}
	}
	for _, w := range lg.Unhealthy {
		res.Warnings = append(res.Warnings, w.At.Format(time.RFC3339Nano)+" "+w.Text)
	}
	allocs := map[string]*AllocRecord{}
	fill := func(recs []AllocRecord) {
		for i := range recs {
			a := &recs[i]
			allocs[a.Job] = a
			if d, ok := lg.Launches[a.AllocID]; ok {
				a.LogmonMS = bench.Millis(d)
			}
			if h, ok := lg.Hooks[a.AllocID]; ok && a.Device != "" {
				a.ReserveMS, a.ReserveStart = bench.Millis(h.Duration), h.Start
				a.ZFSInFlight = inFlight(lg.Commands, h.Start, h.Start.Add(h.Duration))
				r := reservedIn(lg, a.Device, h)
				a.How, a.ReservePluginMS, a.Prepared = r.Text, bench.Millis(r.Took), r.Prepared
				if p, ok := preparedFor(lg, a.Device, a.Job, h); ok && r.Prepared {
					a.PrepLeadMS, a.PrepMS = bench.Millis(h.Start.Sub(p.At)), bench.Millis(p.Took)
				}
				a.Fresh = a.How == "fresh" || a.How == "" && freshAt(lg, a.Device, h.Start)
				if !a.Prepared {
					// A prepared Reserve runs no zfs command: what ends
					// within it is the preparation's, or the release's of
					// the old dataset (the prepared row has them).
					a.ReserveZFSMS = bench.Millis(reserveCommand(lg, a.Device, h))
				}
			}
		}
	}
	fill(res.Idle)
	for i := range res.Batches {
		fill(res.Batches[i].Allocs)
	}
	// The null device's: only the client's hooks are theirs (its device
	// IDs are none of the plugin's slots, so no plugin line matches).
	fill(res.IdleNull)
	for i := range res.Null {
		fill(res.Null[i].Allocs)
	}
	for i := range res.Floor {
		fill(res.Floor[i].Allocs)
	}

	for i, rel := range lg.Releases {
		rec := ReleaseRecord{Device: rel.Device, Job: rel.Job, Start: rel.At, Spare: rel.Spare}
		next := time.Now().Add(time.Hour)
		for _, o := range lg.Releases[i+1:] {
			if o.Device == rel.Device {
				next = o.At
				break
			}
		}
		for _, f := range lg.Fresh {
			if rel.Spare {
				rec.Fresh = rel.At
				break
			}
			if f.Device == rel.Device && !f.At.Before(rel.At) && f.At.Before(next) {
				rec.Fresh = f.At
				break
			}
		}
		rec.OthersReleasing = len(openReleases(lg, rel.At)) - 1
		rec.SentUnhealthyMS, rec.SentHealthyMS = -1, -1
		end := next
		if !rec.Fresh.IsZero() {
			end = rec.Fresh
		}
		for _, f := range lg.Sent {
			if !f.At.Before(rel.At) && !f.At.After(end) && f.Unhealthy[rel.Device] {
				rec.SentUnhealthyMS = bench.Millis(f.At.Sub(rel.At))
				break
			}
		}
		if !rec.Fresh.IsZero() {
			for _, f := range lg.Sent {
				if !f.At.Before(rec.Fresh) && f.At.Before(next) && !f.Unhealthy[rel.Device] {
					rec.SentHealthyMS = bench.Millis(f.At.Sub(rec.Fresh))
					break
				}
			}
		}
		if at, ok := firstSample(samples, rel.Device, rel.At, next, func(h bool) bool { return !h }); ok {
			rec.ShownUnhealthy, rec.UnhealthyDelayMS = true, bench.Millis(at.Sub(rel.At))
		}
		if !rec.Fresh.IsZero() {
			from := rec.Fresh
			if at, ok := firstSample(samples, rel.Device, rel.At, next, func(h bool) bool { return !h }); ok && at.After(from) {
				from = at
			}
			if at, ok := firstSample(samples, rel.Device, from, next, func(h bool) bool { return h }); ok {
				rec.HealthyAgainMS = bench.Millis(at.Sub(rec.Fresh))
				if a := allocs[rel.Job]; a != nil {
					rec.AllocTerminal = a.Terminal
					rec.RecycleMS = bench.Millis(at.Sub(a.Terminal))
					if !a.Terminated.IsZero() {
						rec.RecycleFromTaskMS = bench.Millis(at.Sub(a.Terminated))
					}
				}
			}
		}
		res.Releases = append(res.Releases, rec)
	}
	res.Rows = churnRows(res)
	return nil
}

// reservedIn returns the plugin's "slot reserved" line for device within
// the Reserve that hook timed (its Text says how the slot was handed over,
// its Took how long the plugin took); a zero logEvent when there is none.
// preparedFor returns the latest "slot prepared" line of device for job
// that ended before hook h did.
func preparedFor(lg *churnLog, device, job string, h devicesHook) (logEvent, bool) {
	var out logEvent
	found := false
	for _, p := range lg.Prepared {
		if p.Device == device && p.Job == job && !p.At.After(h.Start.Add(h.Duration)) {
			out, found = p, true
		}
	}
	return out, found
}

func reservedIn(lg *churnLog, device string, h devicesHook) logEvent {
	for _, r := range lg.Reserved {
		if r.Device == device && !r.At.Before(h.Start) && !r.At.After(h.Start.Add(h.Duration)) {
			return r
		}
	}
	return logEvent{}
}

// reserveCommand returns the longest zfs set of a slot state (stateMark)
// that the plugin ran on device's datasets inside the Reserve that hook
// timed, 0 when none. The
// log's timestamps are whole milliseconds: a command may seem to stick out
// of the hook by one.
func reserveCommand(lg *churnLog, device string, h devicesHook) time.Duration {
	var longest time.Duration
	const slack = 2 * time.Millisecond
	from, end := h.Start.Add(-slack), h.Start.Add(h.Duration+slack)
	for _, r := range lg.Marks {
		if r.Device == device && !r.End.After(end) && !r.End.Add(-r.Took).Before(from) && r.Took > longest {
			longest = r.Took
		}
	}
	return longest
}

// freshAt reports whether a slot was fresh at t: the plugin logged a fresh
// dataset for it ("create slot") after its last reservation before t. A
// slot whose tenant has ended but whose release has not begun is not fresh.
func freshAt(lg *churnLog, device string, t time.Time) bool {
	var fresh, reserved time.Time
	for _, f := range lg.Fresh {
		if f.Device == device && !f.At.After(t) && f.At.After(fresh) {
			fresh = f.At
		}
	}
	for _, r := range lg.Reserved {
		if r.Device == device && r.At.Before(t) && r.At.After(reserved) {
			reserved = r.At
		}
	}
	return !fresh.IsZero() && fresh.After(reserved)
}

// listReads counts the reads of reads that ended from start to end, and
// the most allocations one of them listed.
func listReads(reads []logRead, start, end time.Time) (n, most int) {
	for _, rd := range reads {
		if !rd.End.Before(start) && !rd.End.After(end) {
			n++
			most = max(most, rd.Allocs)
		}
	}
	return n, most
}
