package device

import (
	"context"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/structspb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// sharedReadTimeout bounds one read of the shared datasets.
const sharedReadTimeout = time.Minute

// refreshShared reads the shared datasets (one zfs get for all of them),
// within sharedReadTimeout. It never fails: what cannot be read is
// unhealthy with the reason.
func (p *Plugin) refreshShared(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, sharedReadTimeout)
	defer cancel()
	p.shared.Refresh(ctx)
}

// sharedGroups builds one device group per shared class with slots. All
// of a class's instances share its dataset's health.
func sharedGroups(states []shared.State) []*devicepb.DeviceGroup {
	var groups []*devicepb.DeviceGroup
	for _, st := range states {
		c := st.Class
		if c.Slots == 0 {
			continue
		}
		g := &devicepb.DeviceGroup{
			Vendor:     Vendor,
			DeviceType: DeviceType,
			DeviceName: c.Name,
			Attributes: map[string]*structspb.Attribute{
				"shared":     boolAttribute(true),
				"pool":       stringAttribute(zfs.PoolOf(c.Dataset)),
				"mount_path": stringAttribute(c.MountPath),
				"read_only":  boolAttribute(c.ReadOnly),
			},
		}
		for _, id := range shared.IDs(c) {
			g.Devices = append(g.Devices, &devicepb.DetectedDevice{ID: id, Healthy: st.Healthy, HealthDescription: st.Why})
		}
		groups = append(groups, g)
	}
	return groups
}

// sharedStats reports the one dataset of each shared class for every
// instance: used over used plus available.
func sharedStats(states []shared.State, now time.Time) []*devicepb.DeviceGroupStats {
	var groups []*devicepb.DeviceGroupStats
	for _, st := range states {
		c, u := st.Class, st.Usage
		if c.Slots == 0 {
			continue
		}
		g := &devicepb.DeviceGroupStats{Vendor: Vendor, Type: DeviceType, Name: c.Name, InstanceStats: map[string]*devicepb.DeviceStats{}}
		for _, id := range shared.IDs(c) {
			g.InstanceStats[id] = datasetStats(u.Used, u.Available, u.Referenced, u.CompressRatio, u.Used+u.Available,
				"used by the shared dataset over used plus available", "the shared dataset", now)
		}
		groups = append(groups, g)
	}
	return groups
}
