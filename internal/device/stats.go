package device

// Stats: usage per slot, read from ZFS at most once per stats_period and
// streamed at the interval Nomad asks for.

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/structspb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Stats is called by Nomad once; the stream lives until Nomad ends it, and
// Nomad expects a message every collection interval (one second when it
// gives none). ZFS is read at most once per stats_period; cached figures
// are served in between. Called before SetConfig, it fails at once.
func (p *Plugin) Stats(req *devicepb.StatsRequest, stream devicepb.DevicePlugin_StatsServer) error {
	if _, err := p.current(); err != nil {
		return err
	}
	interval := time.Second
	if d := req.GetCollectionInterval(); d != nil {
		if err := d.CheckValid(); err != nil {
			return fmt.Errorf("collection_interval: %w", err)
		}
		if d.AsDuration() > 0 {
			interval = d.AsDuration()
		}
	}
	ctx := stream.Context()
	cfg := loop.Config{Name: "stats", Log: p.log, First: loop.After(0)}
	return loop.Run(ctx, cfg, func(ctx context.Context, _ loop.Wake) loop.Next {
		s, _ := p.current()
		if err := p.slots.RefreshIfOlder(ctx, s.StatsPeriod); err != nil {
			p.log.Warn("stats refresh failed; serving the last figures", "error", err)
		}
		now := time.Now()
		groups := append(statsGroups(s, p.slots.Slots(), now), sharedStats(p.shared.States(), now)...)
		// Send blocks while the agent does not read, and fails once the
		// stream has ended (ctx done): then the loop ends.
		if err := stream.Send(&devicepb.StatsResponse{Groups: groups}); err != nil {
			return streamEnded(ctx, err)
		}
		return loop.After(interval)
	})
}

// streamEnded ends a stream's loop after a failed Send: with no error when
// the stream's ctx is done (Nomad or the plugin ended it), with err
// otherwise.
func streamEnded(ctx context.Context, err error) loop.Next {
	if ctx.Err() != nil {
		return loop.Stop(nil)
	}
	return loop.Stop(err)
}

func statsGroups(s config.Settings, all []slots.Slot, now time.Time) []*devicepb.DeviceGroupStats {
	var groups []*devicepb.DeviceGroupStats
	for _, c := range s.Slots.Classes {
		g := &devicepb.DeviceGroupStats{Vendor: Vendor, Type: DeviceType, Name: c.Name, InstanceStats: map[string]*devicepb.DeviceStats{}}
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
func datasetStats(used, available, referenced uint64, ratio float64, denom uint64, summary, what string, now time.Time) *devicepb.DeviceStats {
	bytes := func(v uint64, desc string) *structspb.StatValue {
		return &structspb.StatValue{IntNumeratorVal: wrapperspb.Int64(int64(v)), Unit: "bytes", Desc: desc}
	}
	return &devicepb.DeviceStats{
		Summary: &structspb.StatValue{IntNumeratorVal: wrapperspb.Int64(int64(used)), IntDenominatorVal: wrapperspb.Int64(int64(denom)), Unit: "bytes", Desc: summary},
		Stats: &structspb.StatObject{Attributes: map[string]*structspb.StatValue{
			"used":          bytes(used, "space used by "+what+" and its snapshots"),
			"available":     bytes(available, "space left to "+what),
			"referenced":    bytes(referenced, "space referenced by "+what),
			"compressratio": {FloatNumeratorVal: wrapperspb.Double(ratio), Unit: "x", Desc: "compression ratio"},
		}},
		Timestamp: timestamppb.New(now),
	}
}
