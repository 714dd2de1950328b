// Command nomad-device-zfs is the Nomad device plugin that hands each task its
// own ZFS dataset. Nomad starts it from the client's plugin_dir; run by hand it
// prints its version.
package main

import (
	"os"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
