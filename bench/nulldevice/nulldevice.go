// Package nulldevice is a Nomad device plugin that does no work: the
// churn benchmark's control. Its Reserve answers at once with a bind mount
// of a host directory made at SetConfig, the same mount and environment
// variable a task of nomad-device-zfs gets, so the same job runs against
// it. What a Reserve of it costs, as the Nomad client times it, is what
// any device plugin's Reserve costs at that moment: gRPC, the client's
// device manager and its hook (bench/README.md, the churn's control rows).
//
// It speaks the device plugin protocol from the project's own protocol
// files (internal/nomadproto), as nomad-device-zfs does. It is never
// shipped: bench/cmd/nulldevice serves it (internal/nomadplugin), and the
// churn scenario puts it beside nomad-device-zfs in the agent it starts.
package nulldevice

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/configspec"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
)

// The plugin's name (its file in the plugin directory, and its block in
// the agent's configuration) and the device it offers: a job asks for it
// as device "nullbench/dataset/<name>".
const (
	PluginName = "nomad-device-null"
	Vendor     = "nullbench"
	DeviceType = "dataset"
)

// Config is the plugin's block in the agent's configuration.
type Config struct {
	// Name is the device name: the job asks for "nullbench/dataset/<name>".
	Name string `cty:"name"`
	// Instances is how many devices it offers, all healthy.
	Instances int `cty:"instances"`
	// HostDir holds one directory per device (made at SetConfig), bound
	// into the task at MountPath.
	HostDir   string `cty:"host_dir"`
	MountPath string `cty:"mount_path"`
	// PathEnv is the environment variable set to MountPath in the task.
	PathEnv string `cty:"path_env"`
}

var configSpec = configspec.Object(map[string]configspec.Spec{
	"name":       configspec.Attr("name", "string", true),
	"instances":  configspec.Attr("instances", "number", true),
	"host_dir":   configspec.Attr("host_dir", "string", true),
	"mount_path": configspec.Attr("mount_path", "string", true),
	"path_env":   configspec.Attr("path_env", "string", true),
})

// Plugin is the null device plugin: it serves Nomad's base and device
// services (nomadplugin.DevicePlugin).
type Plugin struct {
	basepb.UnimplementedBasePluginServer
	devicepb.UnimplementedDevicePluginServer

	log hclog.Logger

	// mu guards cfg, set by SetConfig and read by every other call, and
	// changed, closed (and replaced) when a SetConfig changes the devices.
	mu      sync.Mutex
	cfg     *Config
	changed chan struct{}

	// handMu guards handed: by device ID, the directory its last Reserve
	// bound, when that device's host directory was a symbolic link
	// (handOut).
	handMu sync.Mutex
	handed map[string]string
}

var _ nomadplugin.DevicePlugin = (*Plugin)(nil)

// New returns the plugin; Nomad configures it with SetConfig.
func New(log hclog.Logger) *Plugin {
	return &Plugin{log: log, changed: make(chan struct{}), handed: map[string]string{}}
}

// PluginInfo is called by Nomad when it loads the plugin.
func (p *Plugin) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	return &basepb.PluginInfoResponse{
		Type:              basepb.PluginType_DEVICE,
		PluginApiVersions: []string{nomadplugin.DeviceAPIVersion},
		PluginVersion:     "0.0.1",
		Name:              PluginName,
	}, nil
}

// ConfigSchema is called by Nomad to decode the plugin's block.
func (p *Plugin) ConfigSchema(context.Context, *basepb.ConfigSchemaRequest) (*basepb.ConfigSchemaResponse, error) {
	return &basepb.ConfigSchemaResponse{Spec: configSpec.Proto()}, nil
}

// SetConfig is called by Nomad after loading the plugin (and again when
// it validates the agent's configuration): it checks the block and makes
// the devices' directories, writable by every user as a slot's root is
// by the task's (the exec driver runs tasks as nobody). A block that
// changes the devices wakes the fingerprint streams.
func (p *Plugin) SetConfig(_ context.Context, req *basepb.SetConfigRequest) (*basepb.SetConfigResponse, error) {
	var cfg Config
	if b := req.GetMsgpackConfig(); len(b) > 0 {
		if err := configspec.Decode(configSpec, b, &cfg); err != nil {
			return nil, fmt.Errorf("decoding the %s block: %w", PluginName, err)
		}
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	for _, id := range cfg.ids() {
		dir := filepath.Join(cfg.HostDir, id)
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, fmt.Errorf("%s: host_dir: %w", PluginName, err)
		}
		if err := os.Chmod(dir, 0o777); err != nil { // past the umask
			return nil, fmt.Errorf("%s: host_dir: %w", PluginName, err)
		}
	}
	p.mu.Lock()
	if p.cfg == nil || !proto.Equal(p.cfg.group(), cfg.group()) {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.cfg = &cfg
	p.mu.Unlock()
	p.log.Debug("configured", "name", cfg.Name, "instances", cfg.Instances, "host_dir", cfg.HostDir)
	return &basepb.SetConfigResponse{}, nil
}

// check names the first field of c that cannot be used.
func (c Config) check() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%s: name is empty", PluginName)
	case c.Instances < 1:
		return fmt.Errorf("%s: instances = %d: must be at least 1", PluginName, c.Instances)
	case !filepath.IsAbs(c.HostDir):
		return fmt.Errorf("%s: host_dir = %q: must be an absolute path", PluginName, c.HostDir)
	case !filepath.IsAbs(c.MountPath) || c.MountPath == "/":
		return fmt.Errorf("%s: mount_path = %q: must be an absolute path other than /", PluginName, c.MountPath)
	case c.PathEnv == "":
		return fmt.Errorf("%s: path_env is empty", PluginName)
	}
	return nil
}

// ids are the device IDs c offers, "<name>-0" to "<name>-<instances-1>".
func (c Config) ids() []string {
	out := make([]string, c.Instances)
	for i := range out {
		out[i] = c.Name + "-" + strconv.Itoa(i)
	}
	return out
}

// group is the device group c offers: its devices, all healthy.
func (c Config) group() *devicepb.DeviceGroup {
	g := &devicepb.DeviceGroup{Vendor: Vendor, DeviceType: DeviceType, DeviceName: c.Name}
	for _, id := range c.ids() {
		g.Devices = append(g.Devices, &devicepb.DetectedDevice{ID: id, Healthy: true})
	}
	return g
}

// errNotConfigured is the answer to a device call before SetConfig.
var errNotConfigured = errors.New(PluginName + " is not configured")

func (p *Plugin) config() (*Config, error) {
	cfg, _, err := p.watch()
	return cfg, err
}

// watch returns the configuration and a channel closed when a SetConfig
// changes the devices.
func (p *Plugin) watch() (*Config, <-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg == nil {
		return nil, nil, errNotConfigured
	}
	return p.cfg, p.changed, nil
}

// Fingerprint is called by Nomad once the plugin is configured: it sends
// the devices, all healthy, at once and again only when a SetConfig
// changes them, until the stream ends. Called before SetConfig, it fails
// at once.
func (p *Plugin) Fingerprint(_ *devicepb.FingerprintRequest, stream devicepb.DevicePlugin_FingerprintServer) error {
	ctx := stream.Context()
	var last *devicepb.DeviceGroup
	for {
		cfg, changed, err := p.watch()
		if err != nil {
			return err
		}
		if g := cfg.group(); last == nil || !proto.Equal(g, last) {
			// Send blocks while Nomad does not read, and fails once the
			// stream has ended (ctx done): then the loop ends.
			if err := stream.Send(&devicepb.FingerprintResponse{DeviceGroup: []*devicepb.DeviceGroup{g}}); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%s: sending the fingerprint: %w", PluginName, err)
			}
			last = g
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// Stats is called by Nomad once the first fingerprint is in, to stream
// the devices' statistics: there are none, so it sends an empty answer at
// once and then every collection interval (one second when Nomad gives
// none) until the stream ends. Called before SetConfig, it fails at once.
func (p *Plugin) Stats(req *devicepb.StatsRequest, stream devicepb.DevicePlugin_StatsServer) error {
	if _, err := p.config(); err != nil {
		return err
	}
	interval := time.Second
	if d := req.GetCollectionInterval(); d != nil {
		if err := d.CheckValid(); err != nil {
			return fmt.Errorf("%s: collection_interval: %w", PluginName, err)
		}
		if d.AsDuration() > 0 {
			interval = d.AsDuration()
		}
	}
	ctx := stream.Context()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		if err := stream.Send(&devicepb.StatsResponse{}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s: sending stats: %w", PluginName, err)
		}
		timer.Reset(interval)
	}
}

// Reserve is called by the Nomad client in a task's "devices" prestart
// hook: it answers with the device's directory bound at mount_path and
// path_env set to it, doing nothing else (but follow the device's link,
// handOut).
func (p *Plugin) Reserve(ctx context.Context, req *devicepb.ReserveRequest) (*devicepb.ReserveResponse, error) {
	cfg, err := p.config()
	if err != nil {
		return nil, err
	}
	ids := req.GetDeviceIds()
	if len(ids) != 1 {
		return nil, fmt.Errorf("%s: reserve one device at a time, not %d", PluginName, len(ids))
	}
	known := false
	for _, id := range cfg.ids() {
		known = known || id == ids[0]
	}
	if !known {
		return nil, fmt.Errorf("%s: unknown device ID %q", PluginName, ids[0])
	}
	host, err := p.handOut(ctx, ids[0], filepath.Join(cfg.HostDir, ids[0]))
	if err != nil {
		return nil, err
	}
	return &devicepb.ReserveResponse{ContainerRes: &devicepb.ContainerReservation{
		Envs:   map[string]string{cfg.PathEnv: cfg.MountPath},
		Mounts: []*devicepb.Mount{{TaskPath: cfg.MountPath, HostPath: host}},
	}}, nil
}
