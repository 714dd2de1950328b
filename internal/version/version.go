// Package version names this build of nomad-device-zfs.
package version

import "fmt"

// Version and Commit identify the build. `make build` and `make dist` set
// them from the git tag and commit with
// -ldflags "-X .../internal/version.Version=... -X .../internal/version.Commit=...".
var (
	Version = "0.1.0-dev"
	Commit  = ""
)

// String is what `nomad-device-zfs version` prints:
// "nomad-device-zfs 0.2.0 (commit 1a2b3c4)".
func String() string {
	if Commit == "" {
		return "nomad-device-zfs " + Version
	}
	return fmt.Sprintf("nomad-device-zfs %s (commit %s)", Version, Commit)
}
