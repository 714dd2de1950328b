package pluginhost

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/basepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// TestBuildLaunchKill builds the real plugin, launches it over go-plugin
// gRPC, asks it for its info, and proves Kill ends the process.
func TestBuildLaunchKill(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Skip(t, "no go toolchain on PATH to build the plugin")
	}
	bin := filepath.Join(t.TempDir(), "nomad-device-zfs")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	must.NoError(t, Build(ctx, bin))

	logs := &LogBuffer{}
	p, err := Launch(bin, hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs}))
	must.NoError(t, err, must.Sprintf("plugin log:\n%s", logs))
	t.Cleanup(p.Kill)
	must.Positive(t, p.PID)
	must.NoError(t, syscall.Kill(p.PID, 0), must.Sprint("the plugin process runs"))

	info, err := p.Base.PluginInfo(ctx, &basepb.PluginInfoRequest{})
	must.NoError(t, err)
	must.EqOp(t, basepb.PluginType_DEVICE, info.GetType())
	must.EqOp(t, "nomad-device-zfs", info.GetName())

	p.Kill()
	p.Kill() // twice is fine
	must.True(t, errors.Is(syscall.Kill(p.PID, 0), syscall.ESRCH), must.Sprint("the plugin process is gone after Kill"))
}

// TestLaunchNotAPlugin proves that a binary which does not speak Nomad's
// handshake is an error, and that no process is left behind.
func TestLaunchNotAPlugin(t *testing.T) {
	script := filepath.Join(t.TempDir(), "not-a-plugin")
	must.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho hello\nexit 3\n"), 0o755))
	p, err := Launch(script, hclog.NewNullLogger())
	must.Nil(t, p)
	must.Error(t, err)
}

func TestBuildFails(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Skip(t, "no go toolchain on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Build(ctx, filepath.Join(t.TempDir(), "x"), "-no-such-flag")
	must.ErrorContains(t, err, "building the plugin")
	var exitErr *exec.ExitError
	must.True(t, errors.As(err, &exitErr))
}
