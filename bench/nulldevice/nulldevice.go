// Package nulldevice is a Nomad device plugin that does no work: the
// churn benchmark's control. Its Reserve answers at once with a bind mount
// of a host directory made at SetConfig, the same mount and environment
// variable a task of nomad-device-zfs gets, so the same job runs against
// it. What a Reserve of it costs, as the Nomad client times it, is what
// any device plugin's Reserve costs at that moment: gRPC, the client's
// device manager and its hook (bench/README.md, the churn's control rows).
//
// It is never shipped: bench/cmd/nulldevice serves it, and the churn
// scenario puts it beside nomad-device-zfs in the agent it starts.
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
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
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
	Name string `codec:"name"`
	// Instances is how many devices it offers, all healthy.
	Instances int `codec:"instances"`
	// HostDir holds one directory per device (made at SetConfig), bound
	// into the task at MountPath.
	HostDir   string `codec:"host_dir"`
	MountPath string `codec:"mount_path"`
	// PathEnv is the environment variable set to MountPath in the task.
	PathEnv string `codec:"path_env"`
}

var configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"name":       hclspec.NewAttr("name", "string", true),
	"instances":  hclspec.NewAttr("instances", "number", true),
	"host_dir":   hclspec.NewAttr("host_dir", "string", true),
	"mount_path": hclspec.NewAttr("mount_path", "string", true),
	"path_env":   hclspec.NewAttr("path_env", "string", true),
})

// Plugin is the null device plugin.
type Plugin struct {
	log hclog.Logger

	// mu guards cfg, set by SetConfig and read by every other call.
	mu  sync.Mutex
	cfg *Config
}

// New returns the plugin; Nomad configures it with SetConfig.
func New(log hclog.Logger) *Plugin { return &Plugin{log: log} }

// PluginInfo is called by Nomad when it loads the plugin.
func (p *Plugin) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{
		Type:              base.PluginTypeDevice,
		PluginApiVersions: []string{device.ApiVersion010},
		PluginVersion:     "0.0.1",
		Name:              PluginName,
	}, nil
}

// ConfigSchema is called by Nomad to decode the plugin's block.
func (p *Plugin) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig is called by Nomad after loading the plugin (and again when
// it validates the agent's configuration): it checks the block and makes
// the devices' directories, writable by every user as a slot's root is
// by the task's (the exec driver runs tasks as nobody).
func (p *Plugin) SetConfig(c *base.Config) error {
	var cfg Config
	if len(c.PluginConfig) > 0 {
		if err := base.MsgPackDecode(c.PluginConfig, &cfg); err != nil {
			return fmt.Errorf("decoding the %s block: %w", PluginName, err)
		}
	}
	if err := cfg.check(); err != nil {
		return err
	}
	for _, id := range cfg.ids() {
		dir := filepath.Join(cfg.HostDir, id)
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return fmt.Errorf("%s: host_dir: %w", PluginName, err)
		}
		if err := os.Chmod(dir, 0o777); err != nil { // past the umask
			return fmt.Errorf("%s: host_dir: %w", PluginName, err)
		}
	}
	p.mu.Lock()
	p.cfg = &cfg
	p.mu.Unlock()
	p.log.Debug("configured", "name", cfg.Name, "instances", cfg.Instances, "host_dir", cfg.HostDir)
	return nil
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

func (p *Plugin) config() (*Config, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg == nil {
		return nil, errors.New(PluginName + " is not configured")
	}
	return p.cfg, nil
}

// Fingerprint is called by Nomad once the plugin is configured: it sends
// the devices, all healthy, once, and closes the channel when ctx ends.
func (p *Plugin) Fingerprint(ctx context.Context) (<-chan *device.FingerprintResponse, error) {
	cfg, err := p.config()
	if err != nil {
		return nil, err
	}
	g := &device.DeviceGroup{Vendor: Vendor, Type: DeviceType, Name: cfg.Name}
	for _, id := range cfg.ids() {
		g.Devices = append(g.Devices, &device.Device{ID: id, Healthy: true})
	}
	ch := make(chan *device.FingerprintResponse)
	go func() {
		defer close(ch)
		select {
		case ch <- &device.FingerprintResponse{Devices: []*device.DeviceGroup{g}}:
		case <-ctx.Done():
			return
		}
		<-ctx.Done()
	}()
	return ch, nil
}

// Stats is called by Nomad once the first fingerprint is in, to stream
// the devices' statistics: there are none, so it sends an empty answer
// every interval until ctx ends.
func (p *Plugin) Stats(ctx context.Context, interval time.Duration) (<-chan *device.StatsResponse, error) {
	if _, err := p.config(); err != nil {
		return nil, err
	}
	if interval <= 0 {
		interval = time.Second
	}
	ch := make(chan *device.StatsResponse)
	go func() {
		defer close(ch)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			select {
			case ch <- &device.StatsResponse{}:
			case <-ctx.Done():
				return
			}
			timer.Reset(interval)
		}
	}()
	return ch, nil
}

// Reserve is called by the Nomad client in a task's "devices" prestart
// hook: it answers with the device's directory bound at mount_path and
// path_env set to it, doing nothing else.
func (p *Plugin) Reserve(ids []string) (*device.ContainerReservation, error) {
	cfg, err := p.config()
	if err != nil {
		return nil, err
	}
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
	return &device.ContainerReservation{
		Envs:   map[string]string{cfg.PathEnv: cfg.MountPath},
		Mounts: []*device.Mount{{TaskPath: cfg.MountPath, HostPath: filepath.Join(cfg.HostDir, ids[0])}},
	}, nil
}
