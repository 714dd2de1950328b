package device

import (
	"context"
	"time"

	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/structs"

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
func sharedGroups(states []shared.State) []*device.DeviceGroup {
	var groups []*device.DeviceGroup
	for _, st := range states {
		c := st.Class
		if c.Slots == 0 {
			continue
		}
		g := &device.DeviceGroup{
			Vendor: Vendor,
			Type:   DeviceType,
			Name:   c.Name,
			Attributes: map[string]*structs.Attribute{
				"shared":     structs.NewBoolAttribute(true),
				"pool":       structs.NewStringAttribute(zfs.PoolOf(c.Dataset)),
				"mount_path": structs.NewStringAttribute(c.MountPath),
				"read_only":  structs.NewBoolAttribute(c.ReadOnly),
			},
		}
		for _, id := range shared.IDs(c) {
			g.Devices = append(g.Devices, &device.Device{ID: id, Healthy: st.Healthy, HealthDesc: st.Why})
		}
		groups = append(groups, g)
	}
	return groups
}

// sharedStats reports the one dataset of each shared class for every
// instance: used over used plus available.
func sharedStats(states []shared.State, now time.Time) []*device.DeviceGroupStats {
	var groups []*device.DeviceGroupStats
	for _, st := range states {
		c, u := st.Class, st.Usage
		if c.Slots == 0 {
			continue
		}
		g := &device.DeviceGroupStats{Vendor: Vendor, Type: DeviceType, Name: c.Name, InstanceStats: map[string]*device.DeviceStats{}}
		for _, id := range shared.IDs(c) {
			g.InstanceStats[id] = datasetStats(u.Used, u.Available, u.Referenced, u.CompressRatio, u.Used+u.Available,
				"used by the shared dataset over used plus available", "the shared dataset", now)
		}
		groups = append(groups, g)
	}
	return groups
}
