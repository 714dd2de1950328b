// Package device is the plugin's face to Nomad: the base service
// (PluginInfo, ConfigSchema, SetConfig: this file) and the device service
// (Fingerprint: fingerprint.go, Stats: stats.go, Reserve: reserve.go), as
// internal/nomadproto declares them. Each is a thin translation to the
// parts behind it: the slot manager (internal/slots), the shared classes,
// retention, backups, metrics, which start.go starts. The plugin block
// itself is internal/config's.
package device

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/shared"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/version"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Vendor and DeviceType make the device name "zfs/dataset/<class>".
const (
	Vendor     = "zfs"
	DeviceType = "dataset"
)

// Plugin serves Nomad's base and device services (nomadplugin.DevicePlugin).
type Plugin struct {
	basepb.UnimplementedBasePluginServer
	devicepb.UnimplementedDevicePluginServer

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
	settings config.Settings // replaced by SetConfig
	set      bool
	watching bool // the background parts run (start.go)
	// standIn, when set (UseAllocations), is the node's allocations in
	// place of the Nomad API: no watcher and no release loop start.
	standIn slots.Nomad
	// caps is what the ZFS does beyond the common subset, probed once by
	// the first SetConfig (capsKnown).
	caps      zfs.Capabilities
	capsKnown bool
}

var _ nomadplugin.DevicePlugin = (*Plugin)(nil)

// New returns an unconfigured plugin that runs zfs through runner.
func New(log hclog.Logger, runner *zfs.Runner) *Plugin {
	log = log.Named(config.PluginName)
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
	// An archive retention held back until it was sent is due once the
	// keeper sends it: a retention pass then, not at the next release.
	p.keeper.OnSent(p.pruner.Kick)
	p.meta = newMetaPublisher(log.Named("nodemeta"))
	p.pruner.OnPass(p.meta.Update)
	return p
}

// Serve is the plugin process's life when Nomad's agent starts it: it
// serves a new plugin over go-plugin until the agent ends the process. The
// log goes to the agent as JSON lines, every level (the agent filters).
func Serve() {
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, JSONFormat: true})
	nomadplugin.Serve(New(log, &zfs.Runner{}), log)
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
	return s.Slots.Pool()
}

// Backups returns backup_dir as the keeper's passes last listed it
// (backup.Keeper.Summary): no file is read at scrape time.
func (m metricsSource) Backups() (metrics.Backups, bool) {
	sum, ok := m.p.keeper.Summary()
	if !ok {
		return metrics.Backups{}, false
	}
	b := metrics.Backups{Bytes: sum.Bytes(), ListedAt: sum.ListedAt}
	for _, s := range sum.Identities {
		b.Identities = append(b.Identities, metrics.BackupIdentity{Class: s.Identity.Class, Identity: s.Identity.String(),
			NewestAt: s.NewestAt(), ChainStreams: len(s.Chain), ChainBytes: s.ChainBytes, Forked: s.ForkedWith != ""})
	}
	return b, true
}

// Close stops serving metrics and returns once the server's goroutine has
// ended. Nomad never calls it (it stops the plugin's process); tests do.
// The fingerprint stream's end stops the server as well.
func (p *Plugin) Close() { p.metrics.Close(p.log.Named("metrics")) }

// Settle returns once no slot work runs in the background (releases, spares
// being made), or with ctx's error. Nomad never calls it; the benchmarks
// do, so that one measurement does not run into the last one's work.
func (p *Plugin) Settle(ctx context.Context) error { return p.slots.Wait(ctx) }

// UseAllocations makes a the plugin's source of the node's allocations in
// place of the Nomad API its configuration names. Nomad never calls it; the
// benchmarks give an in-process plugin a stand-in (bench.Tenants), so that
// a plugin started after another adopts the datasets the earlier run armed,
// as it does with Nomad's answer (internal/slots/armed). With a stand-in
// the plugin starts no allocation watcher and no release loop: the caller
// runs the passes (ReleaseEnded). It must come before the first
// fingerprint stream: after it, the watcher may run, and it is refused.
func (p *Plugin) UseAllocations(a slots.Nomad) error {
	p.mu.Lock()
	if p.watching {
		p.mu.Unlock()
		return errors.New("the plugin's background parts already run: a stand-in for the allocations must be given before the first fingerprint")
	}
	p.standIn = a // from here on, startWatching sets no other
	p.mu.Unlock()
	p.slots.SetNomad(a)
	return nil
}

// ReleaseEnded runs one release pass now, as the release loop does at each
// change of the node's allocations: it releases the slots of ended
// allocations and adopts an earlier run's armed datasets that nobody holds.
// Nomad never calls it; the benchmarks do, with UseAllocations.
func (p *Plugin) ReleaseEnded(ctx context.Context) error { return p.slots.ReleaseEnded(ctx) }

// PluginInfo is called by Nomad when it loads the plugin.
func (p *Plugin) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	return &basepb.PluginInfoResponse{
		Type:              basepb.PluginType_DEVICE,
		PluginApiVersions: []string{nomadplugin.DeviceAPIVersion},
		PluginVersion:     version.Version,
		Name:              config.PluginName,
	}, nil
}

// ConfigSchema is called by Nomad to decode the agent's plugin block.
func (p *Plugin) ConfigSchema(context.Context, *basepb.ConfigSchemaRequest) (*basepb.ConfigSchemaResponse, error) {
	return &basepb.ConfigSchemaResponse{Spec: config.Spec.Proto()}, nil
}

// SetConfig is called by Nomad once after loading the plugin (and when the
// agent validates its configuration). It validates every field, checks that
// the parent dataset exists, and only then takes the new configuration: a
// rejected configuration changes nothing. Datasets are provisioned by the
// fingerprint loop, not here, so SetConfig stays quick.
func (p *Plugin) SetConfig(_ context.Context, req *basepb.SetConfigRequest) (*basepb.SetConfigResponse, error) {
	s, err := config.Read(req.GetMsgpackConfig())
	if err != nil {
		return nil, err
	}
	if err := p.check(s); err != nil {
		return nil, fmt.Errorf("%s config: %w", config.PluginName, err)
	}
	p.mu.Lock()
	s.Slots.RenameUnmounts = p.caps.RenameUnmounts()
	p.settings, p.set = s, true
	p.mu.Unlock()
	p.slots.SetConfig(s.Slots)
	p.shared.SetConfig(s.Slots.Parent, []string{s.Slots.KeyDir, s.BackupDir}, s.Shared)
	p.pruner.SetConfig(retention.Config{Container: s.Slots.ArchiveDataset(), Rules: s.Retention, KeyDir: s.Slots.KeyDir})
	classDatasets := map[string]string{}
	for c := range s.BackupClasses {
		classDatasets[c] = s.Slots.ClassDataset(c)
	}
	p.keeper.SetConfig(backup.Config{Dir: s.BackupDir, Container: s.Slots.ArchiveDataset(), Classes: s.BackupClasses, KeyDir: s.Slots.KeyDir,
		Rules: s.Retention, Live: s.BackupLive, ClassDatasets: classDatasets, MaxLag: s.RestoreLag})
	p.log.Info("configured", "parent_dataset", s.Slots.Parent, "classes", len(s.Slots.Classes), "shared_classes", len(s.Shared),
		"fingerprint_period", s.FingerprintPeriod, "stats_period", s.StatsPeriod, "prometheus_address", s.MetricsAddress)
	return &basepb.SetConfigResponse{}, nil
}

// check holds settings s against the host: the parent dataset, the
// classes' properties, the ZFS's capabilities, sources, encryption, and
// last the metrics address, the one check that changes something when it
// passes (the server at the old address, if another, stops).
func (p *Plugin) check(s config.Settings) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.slots.CheckParent(ctx, s.Slots.Parent); err != nil {
		return err
	}
	if err := probeProperties(ctx, p.zfs, p.log, s.Slots.Parent, s.Slots.Classes); err != nil {
		return err
	}
	if err := p.probeCapabilities(ctx, s.Slots.Parent); err != nil {
		return err
	}
	if err := checkSources(ctx, p.zfs, s.Slots.Classes); err != nil {
		return err
	}
	if err := p.checkEncryption(s.Slots, s.Encrypted); err != nil {
		return err
	}
	if err := p.metrics.Serve(s.MetricsAddress, p.log.Named("metrics")); err != nil {
		return fmt.Errorf("telemetry.prometheus_address = %q: %w", s.MetricsAddress, err)
	}
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

// errNotConfigured is the answer to a device call before SetConfig.
var errNotConfigured = errors.New(config.PluginName + " is not configured: SetConfig has not been called")

func (p *Plugin) current() (config.Settings, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.set {
		return config.Settings{}, errNotConfigured
	}
	return p.settings, nil
}
