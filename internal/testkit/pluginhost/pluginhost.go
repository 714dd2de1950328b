// Package pluginhost drives the plugin binary the way a Nomad client does,
// without an agent: it builds the binary, launches it over go-plugin with
// Nomad's handshake (gRPC only, internal/nomadplugin), and encodes
// configuration as the agent does. The benchmarks use it directly; tests
// use it through internal/testkit/devicetest. It imports no test library.
package pluginhost

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sync"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
)

// Package is the import path of the plugin's main package.
const Package = "github.com/nomad-device-zfs/nomad-device-zfs/cmd/nomad-device-zfs"

// Build runs `go build [flags] -o out Package` and returns once the binary
// is at out or the build failed (the error holds go's output). ctx bounds
// the build.
func Build(ctx context.Context, out string, flags ...string) error {
	return BuildPackage(ctx, Package, "the plugin", out, flags...)
}

// BuildPackage is Build for another main package pkg (the benchmark's
// control plugin, say), named what in its error.
func BuildPackage(ctx context.Context, pkg, what, out string, flags ...string) error {
	args := append([]string{"build"}, flags...)
	args = append(args, "-o", out, pkg)
	if b, err := exec.CommandContext(ctx, "go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", what, err, b)
	}
	return nil
}

// Launch starts the plugin binary bin as a Nomad client does (see
// nomadplugin.Launch) and returns once its services answer. The plugin's
// log goes to logger. On error no process is left running; on success the
// caller stops it with Kill.
func Launch(bin string, logger hclog.Logger) (*nomadplugin.Process, error) {
	return nomadplugin.Launch(bin, logger)
}

// LogBuffer collects a plugin's log for a logger's Output; go-plugin's
// goroutines write into it, so it is safe for concurrent use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
