package device

// The device statistics Nomad streams: usage per slot, read from ZFS at
// most once per stats_period.

import (
	"context"
	"time"

	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Stats is called by Nomad once; the stream lives until ctx is done and
// Nomad expects a message every interval (one second by default). ZFS is
// read at most once per stats_period; cached figures are served in between.
func (p *Plugin) Stats(ctx context.Context, interval time.Duration) (<-chan *device.StatsResponse, error) {
	if _, err := p.current(); err != nil {
		return nil, err
	}
	if interval <= 0 {
		interval = time.Second
	}
	ch := make(chan *device.StatsResponse)
	go p.statsLoop(ctx, interval, ch)
	return ch, nil
}

func (p *Plugin) statsLoop(ctx context.Context, interval time.Duration, ch chan<- *device.StatsResponse) {
	defer close(ch)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		s, _ := p.current()
		if err := p.slots.RefreshIfOlder(ctx, s.statsPeriod); err != nil {
			p.log.Warn("stats refresh failed; serving the last figures", "error", err)
		}
		now := time.Now()
		select {
		case ch <- &device.StatsResponse{Groups: append(statsGroups(s, p.slots.Slots(), now), sharedStats(p.shared.States(), now)...)}:
		case <-ctx.Done():
			return
		}
		timer.Reset(interval)
	}
}

func statsGroups(s settings, all []slots.Slot, now time.Time) []*device.DeviceGroupStats {
	var groups []*device.DeviceGroupStats
	for _, c := range s.slots.Classes {
		g := &device.DeviceGroupStats{Vendor: Vendor, Type: DeviceType, Name: c.Name, InstanceStats: map[string]*device.DeviceStats{}}
		for _, sl := range all {
			if sl.Class != c.Name {
				continue
			}
			u := sl.Usage
			g.InstanceStats[sl.ID] = datasetStats(u.Used, u.Available, u.Referenced, u.CompressRatio, c.Quota, "used over quota", "the dataset", now)
		}
		if len(g.InstanceStats) > 0 {
			groups = append(groups, g)
		}
	}
	return groups
}

// datasetStats is one instance's stats: a dataset's space figures, with
// used over denom as the summary; what names the dataset in the
// descriptions.
func datasetStats(used, available, referenced uint64, ratio float64, denom uint64, summary, what string, now time.Time) *device.DeviceStats {
	return &device.DeviceStats{
		Summary: &structs.StatValue{IntNumeratorVal: intPtr(used), IntDenominatorVal: intPtr(denom), Unit: "bytes", Desc: summary},
		Stats: &structs.StatObject{Attributes: map[string]*structs.StatValue{
			"used":          {IntNumeratorVal: intPtr(used), Unit: "bytes", Desc: "space used by " + what + " and its snapshots"},
			"available":     {IntNumeratorVal: intPtr(available), Unit: "bytes", Desc: "space left to " + what},
			"referenced":    {IntNumeratorVal: intPtr(referenced), Unit: "bytes", Desc: "space referenced by " + what},
			"compressratio": {FloatNumeratorVal: &ratio, Unit: "x", Desc: "compression ratio"},
		}},
		Timestamp: now,
	}
}

func intPtr(v uint64) *int64 {
	i := int64(v)
	return &i
}
