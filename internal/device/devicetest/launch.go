package devicetest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/device"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/pluginhost"
)

// buildTimeout bounds one build of the plugin (a cold build cache included).
const buildTimeout = 10 * time.Minute

// BuildPlugin builds the plugin binary into a temporary directory and
// returns its path; a failed build fails the test.
func BuildPlugin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nomad-device-zfs")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	if err := pluginhost.Build(ctx, bin); err != nil {
		t.Fatalf("%v", err)
	}
	return bin
}

// Launch starts the plugin binary the way a Nomad client does (go-plugin,
// Nomad's handshake, gRPC only) and returns the device plugin client. The
// plugin process is stopped at cleanup, and its log is shown when the test
// failed.
func Launch(t testing.TB, bin string) device.DevicePlugin {
	t.Helper()
	logs := &pluginhost.LogBuffer{}
	p, err := pluginhost.Launch(bin, hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Debug, Output: logs}))
	if err != nil {
		t.Fatalf("%v\nplugin log:\n%s", err, logs.String())
	}
	t.Cleanup(p.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", logs.String())
		}
	})
	return p.Device
}
