package nomadplugin

import (
	"context"
	"fmt"
	"net"
	"os/exec"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
)

// Conn is a client of a device plugin's two services, as Nomad's agent
// holds one.
type Conn struct {
	Base   basepb.BasePluginClient
	Device devicepb.DevicePluginClient
}

// Process is a plugin process started by Launch.
type Process struct {
	Conn
	// PID is the plugin process's.
	PID int

	client *plugin.Client
}

// Kill stops the plugin process (the one go-plugin started, by its PID)
// and returns once it has exited. It is safe to call more than once.
func (p *Process) Kill() { p.client.Kill() }

// Launch starts the plugin binary bin as Nomad's agent does (the handshake's
// cookie in its environment, gRPC only, the plugin set dispensed) and
// returns once both services answer. The plugin's log goes to logger. On
// error no process is left running; on success the caller stops it with
// Kill.
func Launch(bin string, logger hclog.Logger, args ...string) (*Process, error) {
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          pluginSet(nil),
		Cmd:              exec.Command(bin, args...),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger,
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("launching %s: %w", bin, err)
	}
	p := &Process{PID: client.ReattachConfig().Pid, client: client}
	for _, d := range []struct {
		set string
		to  func(interface{}) bool
	}{
		{SetBase, func(v interface{}) (ok bool) { p.Base, ok = v.(basepb.BasePluginClient); return ok }},
		{SetDevice, func(v interface{}) (ok bool) { p.Device, ok = v.(devicepb.DevicePluginClient); return ok }},
	} {
		raw, err := rpc.Dispense(d.set)
		if err != nil {
			client.Kill()
			return nil, fmt.Errorf("dispensing the %s service of %s: %w", d.set, bin, err)
		}
		if !d.to(raw) {
			client.Kill()
			return nil, fmt.Errorf("dispensing the %s service of %s: got %T", d.set, bin, raw)
		}
	}
	return p, nil
}

// inProcessBuffer is the in-memory connection's buffer size.
const inProcessBuffer = 1 << 20

// Connect serves p inside this process, over real gRPC on an in-memory
// connection, and returns a client of it and a function that stops both
// (it returns once the server has stopped). It is for callers that drive a
// plugin in their own process (the benchmarks, tests): the calls cross the
// same encoding as between Nomad and a plugin process, without go-plugin's
// process handling.
func Connect(p DevicePlugin) (Conn, func(), error) {
	lis := bufconn.Listen(inProcessBuffer)
	srv := grpc.NewServer()
	basepb.RegisterBasePluginServer(srv, p)
	devicepb.RegisterDevicePluginServer(srv, p)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis) // returns when Stop closes the listener
	}()
	cc, err := grpc.NewClient("passthrough:///in-process",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		<-done
		return Conn{}, func() {}, fmt.Errorf("connecting in process: %w", err)
	}
	stop := func() {
		cc.Close()
		srv.Stop()
		<-done
	}
	return Conn{Base: basepb.NewBasePluginClient(cc), Device: devicepb.NewDevicePluginClient(cc)}, stop, nil
}
