// Package cli is the command line of nomad-device-zfs: serve the plugin when
// Nomad launches it, print help and version when a person runs it.
package cli

import (
	"fmt"
	"io"
	"os"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// magicCookieKey is set by Nomad (go-plugin's handshake) in the environment
// of every plugin it launches.
const magicCookieKey = "NOMAD_PLUGIN_MAGIC_COOKIE"

const usage = `Usage: nomad-device-zfs [version | help]

nomad-device-zfs is a Nomad device plugin: put it in the client's plugin_dir
and configure it in a plugin "nomad-device-zfs" block of the agent config.
Nomad starts it; it does nothing useful when run by hand.
`

// Main runs the command and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 && os.Getenv(magicCookieKey) != "" {
		plugins.Serve(func(log hclog.Logger) interface{} {
			return device.New(log, &zfs.Runner{})
		})
		return 0
	}
	switch {
	case len(args) == 1 && (args[0] == "version" || args[0] == "-version" || args[0] == "--version"):
		fmt.Fprintln(stdout, device.VersionString())
		return 0
	case len(args) == 1 && (args[0] == "help" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
}
