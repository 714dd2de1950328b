package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

const setAsideHelp = `Usage: nomad-device-zfs backups set-aside -alloc=<id> [-identity=<dir>] [-undo] [options]

  Chooses between the forks of an identity's data (a restore refuses with
  "the data of ... forked": a lost node that came back released its
  allocation after a replacement had restored from it and run). The
  backups of the allocation given are set aside in every identity of
  backup_dir that holds one: a restore never takes them, and takes the
  other fork. They stay in backup_dir (retention deletes them by max_age
  alone); -undo takes the choice back. A local archive of the allocation
  set aside that is newer than the other fork is refused too: rename it
  out of the plugin's parent on its node. Needs -config (backup_dir is in
  the agent's configuration). See docs/operations.md, "A lost node that
  comes back".

  It also ends a restore's wait for data that never comes: a replacement
  on another node waits for its predecessor's final backup ("... is not in
  backup_dir yet"), and when that allocation's node will never send it,
  setting it aside with the -identity the error names lets the
  replacement start on the newest data there is.

  -alloc=<id>
    The allocation whose backups are set aside (the full ID, as the
    error names it).

  -identity=<dir>
    With an allocation that left no backup: the identity's directory in
    backup_dir (32 hexadecimal digits, as the restore's error names it)
    where the choice is written.

  -undo
    Take the choice back.
` + commonHelp

// errSetAsideNoAlloc: backups set-aside without -alloc.
var errSetAsideNoAlloc = errors.New("-alloc=<id> is required: the allocation whose backups are set aside")

// runSetAside runs `backups set-aside`.
func runSetAside(args []string, stdout, stderr io.Writer) int {
	var alloc, identity string
	var undo bool
	return runCommand("backups set-aside", setAsideHelp, args, stdout, stderr, func(ctx context.Context, c *common, z *zfs.Client, log hclog.Logger) int {
		if alloc == "" {
			fmt.Fprintf(stderr, "backups set-aside: %v\n\n%s", errSetAsideNoAlloc, setAsideHelp)
			return exitUsage
		}
		if err := c.load(ctx, z); err != nil {
			fmt.Fprintf(stderr, "backups set-aside: %v\n", err)
			return exitFailed
		}
		if c.settings.BackupDir == "" {
			fmt.Fprintf(stderr, "backups set-aside: needs -config with a backup_dir: the plugin block sets none\n")
			return exitUsage
		}
		ms, err := backup.SetAsideIn(c.settings.BackupDir, alloc, identity, undo)
		if err != nil {
			fmt.Fprintf(stderr, "backups set-aside: %v\n", err)
			return exitFailed
		}
		verb := "set aside"
		if undo {
			verb = "no longer set aside"
		}
		if len(ms) == 0 {
			// No backup of it: written where -identity said.
			fmt.Fprintf(stdout, "%s: allocation %s, which left no backup, is %s\n", identity, alloc, verb)
			return exitOK
		}
		seen := map[string]bool{}
		for _, m := range ms {
			if !seen[m.Identity.String()] {
				seen[m.Identity.String()] = true
				n := 0
				for _, o := range ms {
					if o.Identity == m.Identity {
						n++
					}
				}
				fmt.Fprintf(stdout, "%s: the backups of allocation %s (%s, the newest %s) are %s\n", oneLine(m.Identity.String()), alloc, plural(n, "stream"), m.Path(), verb)
			}
		}
		return exitOK
	}, func(fs *flag.FlagSet) {
		fs.StringVar(&alloc, "alloc", "", "the allocation whose backups are set aside")
		fs.StringVar(&identity, "identity", "", "with an allocation that left no backup: the identity's directory in backup_dir")
		fs.BoolVar(&undo, "undo", false, "take the choice back")
	})
}
