// Command configcapture is a device plugin for the wire tests: it returns
// nomad-device-zfs's config schema (internal/config) under the product's
// name, and writes the bytes of every SetConfig it receives to the file its
// -out argument names (through a temporary file and a rename, so the file
// is whole whenever it exists). It offers no device. Nomad's agent starts
// it like the product, so what it captures is what the agent sends the
// product for the same plugin block (e2e/wire_test.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
)

func main() {
	out := flag.String("out", "", "file to write each SetConfig's bytes to")
	flag.Parse()
	if *out == "" || !nomadplugin.Launched() {
		fmt.Fprintln(os.Stderr, "configcapture: a plugin for Nomad's agent; give -out FILE in the plugin block's args")
		os.Exit(2)
	}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, JSONFormat: true})
	nomadplugin.Serve(&capture{out: *out, log: log}, log)
}

type capture struct {
	basepb.UnimplementedBasePluginServer
	devicepb.UnimplementedDevicePluginServer
	out string
	log hclog.Logger
}

func (c *capture) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	return &basepb.PluginInfoResponse{Type: basepb.PluginType_DEVICE, PluginApiVersions: []string{nomadplugin.DeviceAPIVersion},
		PluginVersion: "0.0.0", Name: config.PluginName}, nil
}

func (c *capture) ConfigSchema(context.Context, *basepb.ConfigSchemaRequest) (*basepb.ConfigSchemaResponse, error) {
	return &basepb.ConfigSchemaResponse{Spec: config.Spec.Proto()}, nil
}

// SetConfig writes what the agent sent, whole, to -out.
func (c *capture) SetConfig(_ context.Context, req *basepb.SetConfigRequest) (*basepb.SetConfigResponse, error) {
	tmp, err := os.CreateTemp(filepath.Dir(c.out), ".capture-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(req.GetMsgpackConfig()); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), c.out); err != nil {
		return nil, err
	}
	c.log.Info("captured SetConfig", "bytes", len(req.GetMsgpackConfig()), "api_version", req.GetPluginApiVersion(), "file", c.out)
	return &basepb.SetConfigResponse{}, nil
}

// Fingerprint sends one empty fingerprint (no device) and holds the
// stream open until the agent ends it.
func (c *capture) Fingerprint(_ *devicepb.FingerprintRequest, stream devicepb.DevicePlugin_FingerprintServer) error {
	if err := stream.Send(&devicepb.FingerprintResponse{}); err != nil {
		return nil
	}
	<-stream.Context().Done()
	return nil
}

// Stats sends an empty message every interval until the agent ends it.
func (c *capture) Stats(req *devicepb.StatsRequest, stream devicepb.DevicePlugin_StatsServer) error {
	interval := req.GetCollectionInterval().AsDuration()
	if interval <= 0 {
		interval = time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-ticker.C:
			if err := stream.Send(&devicepb.StatsResponse{}); err != nil {
				return nil
			}
		}
	}
}
