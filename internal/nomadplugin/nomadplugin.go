// Package nomadplugin is the go-plugin side of Nomad's plugin protocol: the
// handshake that Nomad's agent and its plugins share, the plugin set (the
// "base" and "device" services), and both ends of the gRPC connection:
// Serve for the plugin process, Launch and Connect for a client playing the
// agent's part (the tests and the benchmarks). The services themselves are
// internal/nomadproto's.
package nomadplugin

import (
	"context"
	"os"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
)

// The handshake, as Nomad's agent checks it: go-plugin protocol version 2
// (gRPC), and the magic cookie the agent puts in every plugin's
// environment.
const (
	ProtocolVersion  = 2
	MagicCookieKey   = "NOMAD_PLUGIN_MAGIC_COOKIE"
	MagicCookieValue = "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255"
)

// The plugin set's names: the agent dispenses "base" for PluginInfo,
// ConfigSchema and SetConfig, and "device" for the device service.
const (
	SetBase   = "base"
	SetDevice = "device"
)

// DeviceAPIVersion is the version of Nomad's device API this protocol is
// (PluginInfo lists it; the agent names it back in SetConfig).
const DeviceAPIVersion = "v0.1.0"

// Handshake is the go-plugin handshake Nomad's agent expects.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   MagicCookieKey,
	MagicCookieValue: MagicCookieValue,
}

// Launched reports whether this process was started as a plugin (by
// Nomad's agent, or by Launch): the magic cookie is in its environment.
// go-plugin's Serve checks the value itself and explains a wrong one.
func Launched() bool { return os.Getenv(MagicCookieKey) != "" }

// DevicePlugin is what a device plugin serves: the base service and the
// device service.
type DevicePlugin interface {
	basepb.BasePluginServer
	devicepb.DevicePluginServer
}

// Serve serves p over go-plugin (gRPC only) until the agent ends the
// process. logger is the plugin's log, which go-plugin passes on to the
// agent's (as JSON lines on stderr).
func Serve(p DevicePlugin, logger hclog.Logger) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         pluginSet(p),
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          logger,
	})
}

// pluginSet is the set go-plugin serves or dispenses; p is nil on the
// client's side.
func pluginSet(p DevicePlugin) plugin.PluginSet {
	return plugin.PluginSet{
		SetBase:   &basePlugin{impl: p},
		SetDevice: &devicePlugin{impl: p},
	}
}

// basePlugin makes the base service a go-plugin plugin (gRPC only).
type basePlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl basepb.BasePluginServer
}

func (b *basePlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	basepb.RegisterBasePluginServer(s, b.impl)
	return nil
}

func (b *basePlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return basepb.NewBasePluginClient(c), nil
}

// devicePlugin makes the device service a go-plugin plugin (gRPC only).
type devicePlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl devicepb.DevicePluginServer
}

func (d *devicePlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	devicepb.RegisterDevicePluginServer(s, d.impl)
	return nil
}

func (d *devicePlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return devicepb.NewDevicePluginClient(c), nil
}
