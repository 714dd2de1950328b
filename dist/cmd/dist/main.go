// Command dist builds the release files (`make dist`): zips, .deb and .rpm
// packages for linux/amd64 and linux/arm64, and SHA256SUMS. See package
// release.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/nomad-device-zfs/nomad-device-zfs/dist/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/dist/version"
)

func main() {
	repo := flag.String("repo", "..", "the repository's root")
	out := flag.String("out", "out", "directory to write the release files to")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *repo, *out); err != nil {
		fmt.Fprintln(os.Stderr, "dist:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, repo, out string) error {
	info, err := version.FromGit(ctx, repo)
	if err != nil {
		return err
	}
	made, err := release.Run(ctx, release.Config{Repo: repo, Out: out, Info: info, Log: os.Stderr})
	for _, n := range made {
		fmt.Println(n)
	}
	return err
}
