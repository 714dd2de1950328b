// Package e2e holds the end-to-end tests: the plugin binary in a real Nomad
// agent (the version pinned by e2e/nomad/go.mod) on a real ZFS pool
// (zfs-fuse or the kernel module), with no mocks. Run as root:
//
//	CI=true go test -count=1 -v ./e2e/...
//
// Without CI=true, the tests skip when ZFS or Nomad cannot be had. The first
// run builds Nomad into ~/.cache/nomad-device-zfs (several minutes the first time); set
// NOMAD_BIN to use another binary.
package e2e
