// Command nomad-device-zfs is the Nomad device plugin that hands each task its
// own ZFS dataset. Started by Nomad's agent (from the client's plugin_dir), it
// serves the plugin; run by a person, it is the operator's tool.
package main

import (
	"os"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/cli"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
)

func main() {
	if len(os.Args) == 1 && nomadplugin.Launched() {
		device.Serve()
		return
	}
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
