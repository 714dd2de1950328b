// Package device is the Nomad device plugin: its configuration schema,
// SetConfig, Fingerprint, Stats and Reserve. It is a thin translation between
// Nomad's device API and the slot manager.
package device

import (
	"context"
	"errors"
	"fmt"
	"path"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/hashicorp/nomad/plugins/shared/structs"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

const (
	// PluginName is the name operators use in the agent's plugin block.
	PluginName = "nomad-device-zfs"
	// Vendor and DeviceType make the device name "zfs/dataset/<class>".
	Vendor     = "zfs"
	DeviceType = "dataset"
)

// Version and Commit identify the build. `make build` and `make dist` set
// them from the git tag and commit with
// -ldflags "-X .../internal/device.Version=... -X .../internal/device.Commit=...".
var (
	Version = "0.1.0-dev"
	Commit  = ""
)

// VersionString is what `nomad-device-zfs version` prints:
// "nomad-device-zfs 0.2.0 (commit 1a2b3c4)".
func VersionString() string {
	if Commit == "" {
		return PluginName + " " + Version
	}
	return fmt.Sprintf("%s %s (commit %s)", PluginName, Version, Commit)
}

// Plugin implements device.DevicePlugin.
type Plugin struct {
	log   hclog.Logger
	zfs   *zfs.Client
	slots *slots.Manager
	// shared holds the shared classes (internal/shared): read, never
	// written.
	shared *shared.Set
	// pruner keeps the archive within the retention rules.
	pruner *retention.Pruner
	// keeper sends archives to backup_dir and fetches them back.
	keeper *backup.Keeper
	// meta publishes which job groups have data here (node metadata).
	meta *metaPublisher
	// metrics counts what the plugin does, always; it serves the counts
	// only when the configuration has a telemetry address.
	metrics *metrics.Metrics

	// mu guards the fields below.
	mu       sync.Mutex
	settings settings // replaced by SetConfig
	set      bool
	watching bool // the allocation watcher and release loop are running
	// caps is what the ZFS does beyond the common subset, probed once by
	// the first SetConfig (capsKnown).
	caps      zfs.Capabilities
	capsKnown bool
}

// New returns an unconfigured plugin that runs zfs through runner.
func New(log hclog.Logger, runner *zfs.Runner) *Plugin {
	log = log.Named(PluginName)
	if runner.Logger == nil {
		runner.Logger = log.Named("zfs")
	}
	client := zfs.NewClient(runner)
	p := &Plugin{log: log, zfs: client, slots: slots.NewManager(client, log.Named("slots")), shared: shared.NewSet(client),
		pruner: retention.New(client, log.Named("retention")), keeper: backup.NewKeeper(client, log.Named("backup"))}
	p.metrics = metrics.New(metricsSource{p})
	if runner.Observer == nil {
		runner.Observer = p.metrics
	}
	p.slots.SetObserver(slotEvents{Metrics: p.metrics, pruner: p.pruner, keeper: p.keeper})
	p.slots.SetArchives(archiveSource{p.pruner, p.keeper})
	p.meta = newMetaPublisher(log.Named("nodemeta"))
	p.pruner.OnPass(p.meta.Update)
	return p
}

// metricsSource is what the metrics read at scrape time: the slot
// manager's last view, never a zfs command.
type metricsSource struct{ p *Plugin }

// Slots returns every slot as last observed.
func (m metricsSource) Slots() []slots.Slot { return m.p.slots.Slots() }

// ParentAvailable returns the parent dataset's available space as last read.
func (m metricsSource) ParentAvailable() (uint64, bool) { return m.p.slots.ParentAvailable() }

// Pool names the configured pool ("" before SetConfig).
func (m metricsSource) Pool() string {
	s, err := m.p.current()
	if err != nil {
		return ""
	}
	return s.slots.Pool()
}

// Close stops serving metrics and returns once the server's goroutine has
// ended. Nomad never calls it (it stops the plugin's process); tests do.
// The fingerprint stream's end stops the server as well.
func (p *Plugin) Close() { p.metrics.Close(p.log.Named("metrics")) }

var _ device.DevicePlugin = (*Plugin)(nil)

// PluginInfo is called by Nomad when it loads the plugin.
func (p *Plugin) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{
		Type:              base.PluginTypeDevice,
		PluginApiVersions: []string{device.ApiVersion010},
		PluginVersion:     Version,
		Name:              PluginName,
	}, nil
}

// ConfigSchema is called by Nomad to decode the agent's plugin block.
func (p *Plugin) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig is called by Nomad once after loading the plugin (and when the
// agent validates its configuration). It validates every field, checks that
// the parent dataset exists, and only then takes the new configuration: a
// rejected configuration changes nothing. Datasets are provisioned by the
// fingerprint loop, not here, so SetConfig stays quick.
func (p *Plugin) SetConfig(c *base.Config) error {
	var cfg Config
	if err := decodeConfig(c.PluginConfig, &cfg); err != nil {
		return err
	}
	s, err := cfg.validate()
	if err != nil {
		return fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.slots.CheckParent(ctx, s.slots.Parent); err != nil {
		return fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	if err := probeProperties(ctx, p.zfs, p.log, s.slots.Parent, s.slots.Classes); err != nil {
		return fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	if err := p.probeCapabilities(ctx, s.slots.Parent); err != nil {
		return fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	if err := checkSources(ctx, p.zfs, s.slots.Classes); err != nil {
		return fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	if err := p.checkEncryption(s.slots, s.encrypted); err != nil {
		return fmt.Errorf("nomad-device-zfs config: %w", err)
	}
	// Last, as it is the one check that changes something when it passes
	// (the server at the old address, if another, stops).
	if err := p.metrics.Serve(s.metricsAddress, p.log.Named("metrics")); err != nil {
		return fmt.Errorf("nomad-device-zfs config: telemetry.prometheus_address = %q: %w", s.metricsAddress, err)
	}
	p.mu.Lock()
	s.slots.RenameUnmounts = p.caps.RenameUnmounts()
	p.settings, p.set = s, true
	p.mu.Unlock()
	p.slots.SetConfig(s.slots)
	p.shared.SetConfig(s.slots.Parent, []string{s.slots.KeyDir, s.backupDir}, s.shared)
	p.pruner.SetConfig(retention.Config{Container: s.slots.ArchiveDataset(), Rules: s.retention, KeyDir: s.slots.KeyDir})
	p.keeper.SetConfig(backup.Config{Dir: s.backupDir, Container: s.slots.ArchiveDataset(), Classes: s.backupClasses, KeyDir: s.slots.KeyDir})
	p.log.Info("configured", "parent_dataset", s.slots.Parent, "classes", len(s.slots.Classes), "shared_classes", len(s.shared),
		"fingerprint_period", s.fingerprintPeriod, "stats_period", s.statsPeriod, "prometheus_address", s.metricsAddress)
	return nil
}

// probeCapabilities learns, once per plugin process, what this ZFS can do
// (zfs.Client.Probe on a probe dataset under parent, gone on return), so
// that the zfs client uses it from the first command on.
func (p *Plugin) probeCapabilities(ctx context.Context, parent string) error {
	p.mu.Lock()
	known := p.capsKnown
	p.mu.Unlock()
	if known {
		return nil
	}
	name, err := probeName(parent)
	if err != nil {
		return err
	}
	caps, err := p.zfs.Probe(ctx, name+"-caps")
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.caps, p.capsKnown = caps, true
	p.mu.Unlock()
	p.log.Info("zfs capabilities", "zfs", caps.Implementation, "multi_property_set", caps.MultiSet,
		"rename_mounted", caps.RenameMounted, "version_command", caps.Version)
	return nil
}

func (p *Plugin) current() (settings, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.set {
		return settings{}, errors.New("nomad-device-zfs is not configured: SetConfig has not been called")
	}
	return p.settings, nil
}

// Fingerprint is called by Nomad once after SetConfig; the stream lives until
// ctx is done. The loop syncs the slots with ZFS at start and then every
// fingerprint_period, and sends the device groups at start and afterwards
// only when they changed. Transient faults (pool not ONLINE, parent missing,
// zfs failing) are reported as unhealthy devices, never as a fingerprint
// error, which would make Nomad kill the plugin.
func (p *Plugin) Fingerprint(ctx context.Context) (<-chan *device.FingerprintResponse, error) {
	if _, err := p.current(); err != nil {
		return nil, err
	}
	ch := make(chan *device.FingerprintResponse)
	p.startWatching(ctx)
	go p.fingerprintLoop(ctx, ch)
	return ch, nil
}

// startWatching starts, once, the allocation watcher and the release loop,
// for as long as ctx (the fingerprint stream's, which lives as long as the
// plugin) is not done. Without a watcher nothing is ever released.
func (p *Plugin) startWatching(ctx context.Context) {
	p.mu.Lock()
	s := p.settings
	if p.watching {
		p.mu.Unlock()
		return
	}
	p.watching = true
	p.mu.Unlock()

	// The metrics server lives as long as the plugin does.
	go func() {
		<-ctx.Done()
		p.Close()
	}()
	// Retention and backups need no Nomad: they run even when the
	// watcher cannot.
	go p.shared.Run(ctx, s.fingerprintPeriod, sharedReadTimeout)
	go p.pruner.Run(ctx, RetentionPeriod)
	go p.keeper.Run(ctx, RetentionPeriod)

	w, err := allocwatch.New(s.nomad, p.log.Named("allocwatch"))
	if err != nil {
		p.log.Error("cannot watch allocations; no dataset will be released", "error", err)
		return
	}
	p.log.Info("watching allocations", "address", w.Address())
	w.SetObserver(p.metrics)
	p.slots.SetNomad(nomadAllocs{w})
	go func() {
		if id, err := w.NodeID(ctx); err == nil {
			p.keeper.SetNode(id) // named in backup manifests
		}
	}()
	go p.meta.Run(ctx, w, RetentionPeriod)
	go w.Run(ctx, func(*allocwatch.Snapshot) { p.slots.Kick() })
	go p.slots.Run(ctx, s.fingerprintPeriod)
}

func (p *Plugin) fingerprintLoop(ctx context.Context, ch chan<- *device.FingerprintResponse) {
	defer close(ch)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last []*device.DeviceGroup
	sent := false
	for {
		changed, sharedChanged := p.slots.Changed(), p.shared.Changed()
		doSync := false
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			doSync = true
		case <-changed:
			// A release or a reservation changed a slot: send its health
			// now rather than at the next period.
		case <-sharedChanged:
			// A Reserve found a shared dataset changed.
		}
		s, _ := p.current()
		if doSync {
			if err := p.slots.Sync(ctx); err != nil {
				p.log.Error("sync with zfs incomplete; affected devices are unhealthy", "error", err)
			}
			if !p.shared.EverRead() {
				p.refreshShared(ctx) // the first time; then shared.Run does
			}
			timer.Reset(s.fingerprintPeriod)
		}
		groups := append(deviceGroups(s, p.slots.Slots()), sharedGroups(p.shared.States())...)
		if !sent || !reflect.DeepEqual(groups, last) {
			select {
			case ch <- device.NewFingerprint(groups...):
			case <-ctx.Done():
				return
			}
			last, sent = groups, true
			p.log.Debug("fingerprint sent", "groups", len(groups), "unhealthy", unhealthyIDs(groups))
		}
	}
}

// unhealthyIDs lists, in order, the device IDs of groups that are not
// healthy, for the log ("" when all are).
func unhealthyIDs(groups []*device.DeviceGroup) string {
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
func deviceGroups(s settings, all []slots.Slot) []*device.DeviceGroup {
	var groups []*device.DeviceGroup
	for _, c := range s.slots.Classes {
		g := &device.DeviceGroup{
			Vendor: Vendor,
			Type:   DeviceType,
			Name:   c.Name,
			Attributes: map[string]*structs.Attribute{
				"quota":      quotaAttribute(c.Quota),
				"pool":       structs.NewStringAttribute(s.slots.Pool()),
				"mount_path": structs.NewStringAttribute(c.MountPath),
				"read_only":  structs.NewBoolAttribute(c.ReadOnly),
				"restore":    structs.NewStringAttribute(orOff(c.Restore)),
				"shared":     structs.NewBoolAttribute(false),
				"encrypted":  structs.NewBoolAttribute(c.Encrypted),
			},
		}
		for _, sl := range all {
			if sl.Class == c.Name {
				g.Devices = append(g.Devices, &device.Device{ID: sl.ID, Healthy: sl.Healthy, HealthDesc: sl.HealthDesc})
			}
		}
		if len(g.Devices) > 0 {
			groups = append(groups, g)
		}
	}
	return groups
}

// quotaAttribute expresses a byte count in the largest binary unit that
// divides it exactly, so that constraints such as
// `${device.attr.quota} >= 5 GiB` compare correctly. Nomad knows no plain
// byte unit; a count that is not a multiple of 1 KiB is given in KiB as a
// float.
func quotaAttribute(b uint64) *structs.Attribute {
	units := []struct {
		name  string
		shift uint
	}{{structs.UnitPiB, 50}, {structs.UnitTiB, 40}, {structs.UnitGiB, 30}, {structs.UnitMiB, 20}, {structs.UnitKiB, 10}}
	for _, u := range units {
		if b%(1<<u.shift) == 0 {
			return structs.NewIntAttribute(int64(b>>u.shift), u.name)
		}
	}
	return structs.NewFloatAttribute(float64(b)/1024, structs.UnitKiB)
}

// Settle returns once no slot work runs in the background (releases, spares
// being made), or with ctx's error. Nomad never calls it; the benchmarks
// do, so that one measurement does not run into the last one's work.
func (p *Plugin) Settle(ctx context.Context) error { return p.slots.Wait(ctx) }

// Reserve is called by Nomad when a task that asked for devices of one group
// starts, with the instance IDs the scheduler picked. It marks the slots in
// use (one zfs command per free slot, none on a repeated call) and returns
// one bind mount per ID plus environment variables. A slot whose tenant has
// ended is handed over as its spare (two zfs commands; the old dataset is
// archived behind it), or, with no spare, released first: Reserve waits for
// the fresh dataset up to reserve_timeout, then fails (Nomad's restart
// policy retries).
func (p *Plugin) Reserve(ids []string) (*device.ContainerReservation, error) {
	s, err := p.current()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.reserveTimeout)
	defer cancel()
	if len(ids) > 0 {
		if c, ok := p.shared.Class(ids[0]); ok {
			st, err := p.shared.Reserve(ctx, ids)
			if err != nil {
				return nil, err
			}
			hs := make([]held, len(ids))
			for i := range hs {
				hs[i] = held{dataset: c.Dataset, mountpoint: st.Mountpoint}
			}
			return reservation(c.Name, c.MountPath, c.ReadOnly, hs), nil
		}
	}
	reserved, err := p.slots.Reserve(ctx, ids)
	if err != nil {
		return nil, err
	}
	var class slots.Class
	for _, c := range s.slots.Classes {
		if c.Name == reserved[0].Class {
			class = c
		}
	}
	hs := make([]held, len(reserved))
	for i, sl := range reserved {
		hs[i] = held{dataset: sl.Dataset, mountpoint: sl.Mountpoint}
	}
	return reservation(class.Name, class.MountPath, class.ReadOnly, hs), nil
}

// held is one dataset Reserve hands a task: its name and where it is
// mounted on the host.
type held struct{ dataset, mountpoint string }

// reservation builds the mounts and environment for the datasets reserved
// for one request of a class, in the order given: the order of the
// slots' indexes for per-slot classes (slots.Manager.Reserve).
func reservation(class, mountPath string, readOnly bool, ds []held) *device.ContainerReservation {
	name := EnvName(class)
	res := &device.ContainerReservation{Envs: map[string]string{}}
	for i, d := range ds {
		taskPath := mountPath
		if len(ds) > 1 {
			taskPath = path.Join(mountPath, strconv.Itoa(i))
		}
		res.Mounts = append(res.Mounts, &device.Mount{TaskPath: taskPath, HostPath: d.mountpoint, ReadOnly: readOnly})
		if i == 0 {
			res.Envs["ZFS_"+name+"_DATASET"] = d.dataset
			res.Envs["ZFS_"+name+"_PATH"] = taskPath
			res.Envs["ZFS_"+name+"_HOST_PATH"] = d.mountpoint
		}
		if len(ds) > 1 {
			prefix := "ZFS_" + name + "_" + strconv.Itoa(i) + "_"
			res.Envs[prefix+"DATASET"] = d.dataset
			res.Envs[prefix+"PATH"] = taskPath
			res.Envs[prefix+"HOST_PATH"] = d.mountpoint
		}
	}
	return res
}

// EnvName turns a class name into the NAME of its environment variables:
// upper case, '-' becomes '_'.
func EnvName(class string) string {
	return strings.ReplaceAll(strings.ToUpper(class), "-", "_")
}

// orOff is a class's restore as the "restore" attribute shows it.
func orOff(restore string) string {
	if restore == "" {
		return slots.RestoreOff
	}
	return restore
}
