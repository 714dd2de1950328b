// Package cli is the operator's command line of nomad-device-zfs, what
// the binary does when a person runs it: status, doctor, archives, prune,
// backups verify, version. (When Nomad's agent starts the binary, it
// serves the plugin instead: see cmd/nomad-device-zfs.)
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/config"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/version"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Exit statuses, for scripts.
const (
	exitOK     = 0
	exitFailed = 1 // doctor found a failure, or the command could not do its work
	exitUsage  = 2 // the command line is wrong
)

const usage = `Usage: nomad-device-zfs <command> [options]

nomad-device-zfs is a Nomad device plugin that gives each task its own ZFS
dataset. Nomad starts it from the client's plugin_dir; run by a person, it
is the operator's tool:

    status     One row per slot: state, holder, space; works while Nomad is down;
               with backup_dir, per identity its newest backup and chain
    doctor     Check ZFS, the pool, the parent dataset, the Nomad API, the token
               and the agent configuration; exits 1 when a check fails
    archives   The archived datasets: identity, slot, age, size, and which
               retention rule would delete them
    prune      Apply retention (keep, max_age, archive_quota) now; -dry-run
               says what it would delete and why
    backups verify
               Check every stream in backup_dir against its manifest; exits 1
               on a bad one or a forked identity
    backups set-aside
               Choose between the forks of an identity's data: a restore
               never takes the backups of the allocation given
    version    Print the version and commit

Run "nomad-device-zfs <command> -help" for a command's options.
`

// Main runs the command and returns its exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "version", "-version", "--version":
		switch {
		case len(args) == 2 && (args[1] == "-help" || args[1] == "-h" || args[1] == "--help"):
			fmt.Fprint(stdout, versionHelp)
			return exitOK
		case len(args) > 1:
			fmt.Fprintf(stderr, "version: unexpected argument %q\n\n%s", args[1], versionHelp)
			return exitUsage
		}
		fmt.Fprintln(stdout, version.String())
		return exitOK
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "status":
		return runCommand("status", statusHelp, args[1:], stdout, stderr, func(ctx context.Context, c *common, z *zfs.Client, log hclog.Logger) int {
			if err := c.load(ctx, z); err != nil {
				fmt.Fprintf(stderr, "status: %v\n", err)
				return exitFailed
			}
			if err := runStatus(ctx, c, z, stdout, log); err != nil {
				fmt.Fprintf(stderr, "status: %v\n", err)
				return exitFailed
			}
			return exitOK
		})
	case "archives":
		return runCommand("archives", archivesHelp, args[1:], stdout, stderr, func(ctx context.Context, c *common, z *zfs.Client, log hclog.Logger) int {
			if err := c.load(ctx, z); err != nil {
				fmt.Fprintf(stderr, "archives: %v\n", err)
				return exitFailed
			}
			now := time.Now()
			r, err := gatherArchives(ctx, z, c, now)
			if err == nil && c.jsonOut {
				err = writeJSON(stdout, r)
			} else if err == nil {
				err = renderArchives(stdout, r, now)
			}
			if err != nil {
				fmt.Fprintf(stderr, "archives: %v\n", err)
				return exitFailed
			}
			return exitOK
		})
	case "prune":
		var dryRun bool
		return runCommand("prune", pruneHelp, args[1:], stdout, stderr, func(ctx context.Context, c *common, z *zfs.Client, log hclog.Logger) int {
			if err := c.load(ctx, z); err != nil {
				fmt.Fprintf(stderr, "prune: %v\n", err)
				return exitFailed
			}
			r, err := runPrune(ctx, c, z, dryRun, log)
			if errors.Is(err, errPruneNeedsConfig) {
				fmt.Fprintf(stderr, "prune: %v\n", err)
				return exitUsage
			}
			// What was deleted is shown even when a later destroy failed.
			var werr error
			if c.jsonOut {
				werr = writeJSON(stdout, r)
			} else {
				werr = renderPrune(stdout, r)
			}
			if err = errors.Join(err, werr); err != nil {
				fmt.Fprintf(stderr, "prune: %v\n", err)
				return exitFailed
			}
			return exitOK
		}, func(fs *flag.FlagSet) {
			fs.BoolVar(&dryRun, "dry-run", false, "say what would be deleted; delete nothing")
		})
	case "backups":
		if len(args) >= 2 && args[1] == "set-aside" {
			return runSetAside(args[2:], stdout, stderr)
		}
		if len(args) < 2 || args[1] != "verify" {
			fmt.Fprintf(stderr, "backups: want the subcommand verify or set-aside\n\n%s", backupsVerifyHelp)
			return exitUsage
		}
		return runCommand("backups verify", backupsVerifyHelp, args[2:], stdout, stderr, func(ctx context.Context, c *common, z *zfs.Client, log hclog.Logger) int {
			if err := c.load(ctx, z); err != nil {
				fmt.Fprintf(stderr, "backups verify: %v\n", err)
				return exitFailed
			}
			if c.settings.BackupDir == "" {
				fmt.Fprintf(stderr, "backups verify: %v\n", errNoBackupDir)
				return exitUsage
			}
			r, err := verifyBackups(c.settings.BackupDir)
			if err == nil && c.jsonOut {
				err = writeJSON(stdout, r)
			} else if err == nil {
				err = renderBackups(stdout, r)
			}
			if err != nil {
				fmt.Fprintf(stderr, "backups verify: %v\n", err)
				return exitFailed
			}
			if r.Bad > 0 {
				return exitFailed
			}
			return exitOK
		})
	case "doctor":
		return runCommand("doctor", doctorHelp, args[1:], stdout, stderr, func(ctx context.Context, c *common, z *zfs.Client, log hclog.Logger) int {
			d := &doctor{c: c, z: z, log: log}
			d.loadErr = c.load(ctx, z)
			checks := d.run(ctx)
			var err error
			if c.jsonOut {
				err = writeJSON(stdout, checks)
			} else {
				err = renderDoctor(stdout, checks)
			}
			if err != nil || failed(checks) {
				return exitFailed
			}
			return exitOK
		})
	}
	fmt.Fprintf(stderr, "nomad-device-zfs: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

const versionHelp = `Usage: nomad-device-zfs version

  Prints the plugin's version and the commit it was built from, as Nomad
  shows the plugin's version in its fingerprint.
`

const statusHelp = `Usage: nomad-device-zfs status [options]

  Shows every slot of the plugin on this node: its class, device ID,
  dataset, state (free, in use, releasing, unhealthy, with the reason), the
  allocation that holds it and its space; then a line per class, the pool's
  health and free space, and the archive; with a backup_dir (-config), per
  identity backed up its newest backup's release, age and size, and the
  length and size of the chain that restores it, a broken chain flagged
  (from the manifests: backups verify reads the streams). It reads ZFS and
  backup_dir and changes nothing.
  It also asks Nomad (for at most 5 s) for the node's allocations; when
  Nomad does not answer it still lists every slot and says so.
` + commonHelp

const doctorHelp = `Usage: nomad-device-zfs doctor [options]

  Checks, one line each (ok, warn, fail, skip), what the plugin needs:
  the agent configuration (exactly one plugin block, valid), its plugin_dir
  holding this binary, zfs and zpool, the pool and the space for the
  classes' quotas, the parent dataset and what is under it, the slots, the
  Nomad API at the configured address with the configured TLS, the node ID,
  a token that sees every namespace, and a read of the node's allocations.
  For anything not ok it says what to do. Exits 1 when any check fails.
` + commonHelp

// runCommand parses a command's flags (the common ones, and those extra
// registers) and runs fn with a deadline.
func runCommand(name, help string, args []string, stdout, stderr io.Writer,
	fn func(context.Context, *common, *zfs.Client, hclog.Logger) int, extra ...func(*flag.FlagSet)) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := &common{}
	c.register(fs)
	for _, f := range extra {
		f(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			return exitOK
		}
		fmt.Fprintf(stderr, "%s: %v\n\n%s", name, err, help)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n\n%s", name, fs.Arg(0), help)
		return exitUsage
	}
	timeout, err := time.ParseDuration(c.timeout)
	if err != nil || timeout <= 0 {
		fmt.Fprintf(stderr, "%s: -timeout=%s: want a positive duration such as 30s\n", name, c.timeout)
		return exitUsage
	}
	c.deadline = timeout
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	log := hclog.New(&hclog.LoggerOptions{Name: config.PluginName, Output: stderr, Level: hclog.Error})
	z := zfs.NewClient(&zfs.Runner{Timeout: timeout, BusyRetries: 1})
	return fn(ctx, c, z, log)
}
