package devicetest

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"
)

// BuildPlugin builds the plugin binary into a temporary directory and
// returns its path.
func BuildPlugin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nomad-device-zfs")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nomad-device-zfs/nomad-device-zfs/cmd/nomad-device-zfs")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	return bin
}

// Launch starts the plugin binary the way a Nomad client does (go-plugin,
// Nomad's handshake, gRPC only) and returns the device plugin client. The
// plugin process is stopped at cleanup.
func Launch(t testing.TB, bin string) device.DevicePlugin {
	t.Helper()
	logs := &syncBuffer{}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: base.Handshake,
		Plugins: map[string]plugin.Plugin{
			base.PluginTypeBase:   &base.PluginBase{},
			base.PluginTypeDevice: &device.PluginDevice{},
		},
		Cmd:              exec.Command(bin),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Debug, Output: logs}),
	})
	t.Cleanup(client.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", logs.String())
		}
	})
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("connecting to the plugin: %v", err)
	}
	raw, err := rpc.Dispense(base.PluginTypeDevice)
	if err != nil {
		t.Fatalf("dispensing the device plugin: %v", err)
	}
	dp, ok := raw.(device.DevicePlugin)
	if !ok {
		t.Fatalf("dispensed %T, not a device plugin", raw)
	}
	return dp
}

// syncBuffer collects the plugin's log; the plugin's output is copied in by
// go-plugin's goroutines, so writes are guarded by mu.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
