// Command version prints the version and the commit of the git work tree it
// runs in, separated by a space, as package version works them out; the
// Makefile stamps them into the binary. Outside a git work tree (a source
// archive) it prints 0.0.0-dev alone.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/nomad-device-zfs/nomad-device-zfs/dist/version"
)

func main() {
	info, err := version.FromGit(context.Background(), ".")
	switch {
	case errors.Is(err, version.ErrNoRepository):
		fmt.Println("0.0.0-dev")
	case err != nil:
		fmt.Fprintln(os.Stderr, "version:", err)
		os.Exit(1)
	default:
		fmt.Println(info.Version, info.Commit)
	}
}
