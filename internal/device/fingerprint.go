package device

// Fingerprint: the device groups Nomad schedules on, one per class, sent at
// once and then whenever they change.

import (
	"context"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/structspb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Fingerprint is called by Nomad once after SetConfig; the stream lives
// until Nomad ends it (or the plugin). The loop syncs the slots with ZFS at
// start and then every fingerprint_period, and sends the device groups at
// start and afterwards only when they changed. Transient faults (pool not
// ONLINE, parent missing, zfs failing) are reported as unhealthy devices,
// never as an error ending the stream, which would make Nomad kill the
// plugin. Called before SetConfig, it fails at once.
func (p *Plugin) Fingerprint(_ *devicepb.FingerprintRequest, stream devicepb.DevicePlugin_FingerprintServer) error {
	if _, err := p.current(); err != nil {
		return err
	}
	ctx := stream.Context()
	p.startWatching(ctx)
	// A change of a slot (a release, a reservation) or of a shared class's
	// health (found by a Reserve) kicks a send now rather than at the next
	// period. The slots' channel is taken before the first read of them.
	kick := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func(changed <-chan struct{}) {
		defer close(watched)
		p.kickAtChanges(wctx, changed, kick)
	}(p.slots.Changed())
	defer func() { cancel(); <-watched }()

	var last []*devicepb.DeviceGroup
	sent := false
	cfg := loop.Config{Name: "fingerprint", Log: p.log, First: loop.After(0), Kick: kick}
	return loop.Run(ctx, cfg, func(ctx context.Context, w loop.Wake) loop.Next {
		s, _ := p.current()
		next := loop.Next{} // a kicked run leaves the sync's timer as it is
		if w.Timer {
			if err := p.slots.Sync(ctx); err != nil {
				p.log.Error("sync with zfs incomplete; affected devices are unhealthy", "error", err)
			}
			if !p.shared.EverRead() {
				p.refreshShared(ctx) // the first time; then shared.Run does
			}
			next = loop.After(s.FingerprintPeriod)
		}
		groups := append(deviceGroups(s, p.slots.Slots()), sharedGroups(p.shared.States())...)
		if sent && sameGroups(groups, last) {
			return next
		}
		// Send blocks while the agent does not read, and fails once the
		// stream has ended (ctx done): then the loop ends.
		if err := stream.Send(&devicepb.FingerprintResponse{DeviceGroup: groups}); err != nil {
			return streamEnded(ctx, err)
		}
		last, sent = groups, true
		p.log.Debug("fingerprint sent", "groups", len(groups), "unhealthy", unhealthyIDs(groups))
		return next
	})
}

// kickAtChanges kicks at each change of the slot list (changed is the
// slots' channel, taken before the fingerprint first read them) and of a
// shared class's health, until ctx is done. The next channel of the slots
// is taken before the kick, so that the run the kick starts reads the slots
// after it was taken: a change landing after that read, while Send waits
// on the agent, closes the channel watched here and kicks again.
func (p *Plugin) kickAtChanges(ctx context.Context, changed <-chan struct{}, kick chan<- struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			changed = p.slots.Changed()
		case <-p.shared.Changed():
		}
		loop.Kick(kick)
	}
}

// sameGroups reports whether two fingerprints say the same.
func sameGroups(a, b []*devicepb.DeviceGroup) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// unhealthyIDs lists, in order, the device IDs of groups that are not
// healthy, for the log ("" when all are).
func unhealthyIDs(groups []*devicepb.DeviceGroup) string {
	var ids []string
	for _, g := range groups {
		for _, d := range g.Devices {
			if !d.Healthy {
				ids = append(ids, d.ID)
			}
		}
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

// deviceGroups builds one group per class with at least one slot. The result
// depends only on configuration and health, not on usage, so that an
// unchanged node sends no new fingerprint.
func deviceGroups(s config.Settings, all []slots.Slot) []*devicepb.DeviceGroup {
	var groups []*devicepb.DeviceGroup
	for _, c := range s.Slots.Classes {
		g := &devicepb.DeviceGroup{
			Vendor:     Vendor,
			DeviceType: DeviceType,
			DeviceName: c.Name,
			Attributes: map[string]*structspb.Attribute{
				"quota":      quotaAttribute(c.Quota),
				"pool":       stringAttribute(s.Slots.Pool()),
				"mount_path": stringAttribute(c.MountPath),
				"read_only":  boolAttribute(c.ReadOnly),
				"restore":    stringAttribute(orOff(c.Restore)),
				"shared":     boolAttribute(false),
				"encrypted":  boolAttribute(c.Encrypted),
			},
		}
		for _, sl := range all {
			if sl.Class == c.Name {
				g.Devices = append(g.Devices, &devicepb.DetectedDevice{ID: sl.ID, Healthy: sl.Healthy, HealthDescription: sl.HealthDesc})
			}
		}
		if len(g.Devices) > 0 {
			groups = append(groups, g)
		}
	}
	return groups
}

// The units Nomad's constraints know for bytes, by the power of two each is.
var byteUnits = []struct {
	name  string
	shift uint
}{{"PiB", 50}, {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}

// quotaAttribute expresses a byte count in the largest binary unit that
// divides it exactly, so that constraints such as
// `${device.attr.quota} >= 5 GiB` compare correctly. Nomad knows no plain
// byte unit; a count that is not a multiple of 1 KiB is given in KiB as a
// float.
func quotaAttribute(b uint64) *structspb.Attribute {
	for _, u := range byteUnits {
		if b%(1<<u.shift) == 0 {
			return &structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: int64(b >> u.shift)}, Unit: u.name}
		}
	}
	return &structspb.Attribute{Value: &structspb.Attribute_FloatVal{FloatVal: float64(b) / 1024}, Unit: "KiB"}
}

func stringAttribute(s string) *structspb.Attribute {
	return &structspb.Attribute{Value: &structspb.Attribute_StringVal{StringVal: s}}
}

func boolAttribute(b bool) *structspb.Attribute {
	return &structspb.Attribute{Value: &structspb.Attribute_BoolVal{BoolVal: b}}
}
