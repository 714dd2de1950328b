package e2e

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/pluginhost"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// The golden files of the wire (see internal/config/golden_test.go).
var (
	goldenBlock   = filepath.Join("..", "internal", "config", "testdata", "golden-agent.hcl")
	goldenCapture = filepath.Join("..", "internal", "config", "testdata", "agent-setconfig.msgpack")
)

// TestWire_AgentSendsTheGoldenConfig starts a real Nomad agent with a
// plugin (e2e/configcapture) that returns the product's config schema and
// records what SetConfig receives, given the golden plugin block. The
// agent's bytes must be the golden capture, which internal/config's tests
// decode and compare with their own encoding. UPDATE_GOLDEN=1 writes the
// capture anew instead (then review the diff of the settings it decodes
// to: TestGolden_AgentCapture).
func TestWire_AgentSendsTheGoldenConfig(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	t.Parallel()
	pluginDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	must.NoError(t, pluginhost.BuildPackage(ctx, "github.com/nomad-device-zfs/nomad-device-zfs/e2e/configcapture", "the capture plugin",
		filepath.Join(pluginDir, config.PluginName)))

	block, err := os.ReadFile(goldenBlock)
	must.NoError(t, err)
	out := filepath.Join(t.TempDir(), "setconfig.msgpack")
	// The capture's file goes in the plugin block's args, beside its config.
	withArgs := strings.Replace(string(block), `plugin "nomad-device-zfs" {`,
		`plugin "nomad-device-zfs" {`+"\n  args = [\"-out\", \""+out+"\"]", 1)
	must.StrContains(t, withArgs, out)
	nomadtest.StartAgent(t, nomadtest.Options{PluginDir: pluginDir, PluginConfig: withArgs})

	var got []byte
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		got, err = os.ReadFile(out)
		return err
	}), wait.Timeout(2*time.Minute), wait.Gap(200*time.Millisecond)), must.Sprint("the agent never called SetConfig"))

	if os.Getenv("UPDATE_GOLDEN") == "1" {
		must.NoError(t, os.WriteFile(goldenCapture, got, 0o644))
		t.Logf("wrote %s (%d bytes)", goldenCapture, len(got))
		return
	}
	want, err := os.ReadFile(goldenCapture)
	must.NoError(t, err)
	must.Eq(t, hex.Dump(want), hex.Dump(got), must.Sprint("the agent sent other bytes than the golden capture: if Nomad changed, run with UPDATE_GOLDEN=1 and review"))
}
