package zfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Implementation names the ZFS this machine runs, for the operator's
// `doctor`: "OpenZFS zfs-2.3.2-2~bpo12+2" from `zfs version` where it
// exists, else the kernel module's version from sysfs, else "zfs-fuse"
// when there is no /dev/zfs (zfs-fuse 0.7 has no version command). It
// returns an error only when ZFS does not answer at all (`zpool list`).
func (c *Client) Implementation(ctx context.Context) (string, error) {
	name, _, err := c.implementation(ctx)
	return name, err
}

// implementation is Implementation, also saying whether `zfs version`
// answered (for Probe, so that it runs once).
func (c *Client) implementation(ctx context.Context) (name string, versionCmd bool, err error) {
	if _, err := c.Runner.ZpoolCmd(ctx, "list", "-H", "-o", "name"); err != nil {
		return "", false, err
	}
	out, err := c.Runner.ZFSCmd(ctx, "version")
	if err == nil {
		if line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n"); line != "" {
			return "OpenZFS " + line, true, nil
		}
	}
	versionCmd = err == nil
	if ctxErr := ctx.Err(); ctxErr != nil {
		return "", false, fmt.Errorf("zfs version: %w", ctxErr)
	}
	if b, err := os.ReadFile("/sys/module/zfs/version"); err == nil {
		return "OpenZFS " + strings.TrimSpace(string(b)), versionCmd, nil
	}
	if _, err := os.Stat("/dev/zfs"); errors.Is(err, os.ErrNotExist) {
		return "zfs-fuse", versionCmd, nil
	}
	return "ZFS (version unknown)", versionCmd, nil
}
