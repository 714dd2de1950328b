// Command nulldevice serves the churn benchmark's control device plugin
// (bench/nulldevice) when Nomad launches it from its plugin directory.
package main

import (
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench/nulldevice"
)

func main() {
	plugins.Serve(func(log hclog.Logger) interface{} { return nulldevice.New(log) })
}
