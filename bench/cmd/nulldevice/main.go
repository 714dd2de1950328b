// Command nulldevice serves the churn benchmark's control device plugin
// (bench/nulldevice) when Nomad launches it from its plugin directory,
// over go-plugin with Nomad's handshake (internal/nomadplugin). Its log
// goes to the agent as JSON lines, every level (the agent filters), as
// nomad-device-zfs's does.
package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench/nulldevice"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
)

func main() {
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, JSONFormat: true})
	nomadplugin.Serve(nulldevice.New(log), log)
}
