package config

import (
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/agentconfig"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// The golden files of the wire: the plugin block, and what Nomad's agent
// (v1.11.3) sent to SetConfig for it, captured from a real agent by
// e2e.TestWire_AgentSendsTheGoldenConfig (which fails, and with
// UPDATE_GOLDEN=1 writes the file anew, when the agent sends other bytes).
const (
	goldenBlock   = "testdata/golden-agent.hcl"
	goldenCapture = "testdata/agent-setconfig.msgpack"
)

// goldenConfig is the golden plugin block as the agent's files give it.
func goldenConfig(t *testing.T) map[string]interface{} {
	t.Helper()
	a, err := agentconfig.Load([]string{goldenBlock})
	must.NoError(t, err)
	p, ok := a.Plugin(PluginName)
	must.True(t, ok, must.Sprintf("no plugin %q block in %s", PluginName, goldenBlock))
	return p.Config
}

// TestGolden_AgentCapture: what a real agent sent decodes to the settings
// the plugin block says, and this package's own encoding of the block (the
// operator CLI's path, and the tests') is byte for byte what the agent
// sent.
func TestGolden_AgentCapture(t *testing.T) {
	captured, err := os.ReadFile(goldenCapture)
	must.NoError(t, err)

	fromAgent, err := Read(captured)
	must.NoError(t, err)
	fromBlock, err := FromAgent(goldenConfig(t))
	must.NoError(t, err)
	must.Eq(t, fromBlock, fromAgent)

	ours, err := Encode(goldenConfig(t))
	must.NoError(t, err)
	must.Eq(t, captured, ours, must.Sprint("this package encodes the block as the agent does"))

	// What the block says, read back from the agent's bytes: defaults the
	// agent filled in, numbers given as strings, both property syntaxes,
	// every kind of class.
	must.Eq(t, "tank/nomad", fromAgent.Slots.Parent)
	must.Eq(t, "30s", fromAgent.FingerprintPeriod.String())
	must.Eq(t, "45s", fromAgent.ReserveTimeout.String())
	must.Eq(t, "127.0.0.1:9464", fromAgent.MetricsAddress)
	must.Eq(t, "client.global.nomad", fromAgent.Nomad.TLSServerName)
	must.Eq(t, uint64(200<<30), fromAgent.Retention.Quota)
	must.Eq(t, "/mnt/zfs-backups", fromAgent.BackupDir)
	classes := map[string]slots.Class{}
	for _, c := range fromAgent.Slots.Classes {
		classes[c.Name] = c
	}
	must.MapLen(t, 4, classes)
	must.Eq(t, map[string]string{"compression": "on", "atime": "off"}, classes["scratch"].Properties)
	must.Eq(t, map[string]string{"recordsize": "128K"}, classes["tmp"].Properties)
	must.Eq(t, 1, classes["tmp"].Slots)
	must.Eq(t, "destroy", classes["golden"].OnRelease)
	must.True(t, classes["secret"].Encrypted)
	must.Eq(t, map[string]time.Duration{"scratch": 5 * time.Minute}, fromAgent.BackupLive)
	must.Eq(t, map[string]time.Duration{"scratch": 15 * time.Minute}, fromAgent.RestoreLag)
	must.SliceLen(t, 1, fromAgent.Shared)
	must.Eq(t, "tank/models", fromAgent.Shared[0].Dataset)
	must.True(t, fromAgent.Shared[0].ReadOnly)
}

// TestGolden_CorruptCapture: bytes that are not the schema's value are
// refused with an error, not decoded into something else.
func TestGolden_CorruptCapture(t *testing.T) {
	captured, err := os.ReadFile(goldenCapture)
	must.NoError(t, err)
	for _, n := range []int{1, len(captured) / 2, len(captured) - 1} {
		_, err := Read(captured[:n])
		must.ErrorContains(t, err, "nomad-device-zfs config: decoding the config")
	}
}
