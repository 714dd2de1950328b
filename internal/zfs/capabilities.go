package zfs

import (
	"context"
	"errors"
	"fmt"
)

// Capabilities is what this machine's ZFS does beyond the subset that
// OpenZFS and zfs-fuse 0.7 share, learned by trying it (Client.Probe),
// never from a version string alone.
type Capabilities struct {
	// Implementation names the ZFS ("OpenZFS zfs-2.3.2-2~bpo12+2",
	// "zfs-fuse"); see Client.Implementation.
	Implementation string
	// MultiSet: `zfs set k1=v1 k2=v2 dataset` sets both in one command
	// (OpenZFS). zfs-fuse reads the second assignment as a dataset name.
	MultiSet bool
	// RenameMounted: `zfs rename` of a mounted filesystem works, remounting
	// it at its new mountpoint (OpenZFS). zfs-fuse answers "dataset is busy"
	// most of the time but lets one through now and then: see
	// RenameUnmounts for what the plugin makes of it.
	RenameMounted bool
	// Version: the `zfs version` command exists (OpenZFS).
	Version bool
	// Encryption: native encryption (the encryption property exists;
	// OpenZFS 0.8 and later). zfs-fuse has none.
	Encryption bool
}

// RenameUnmounts reports whether a release may let `zfs rename` do its
// unmount (slots.Config.RenameUnmounts): a mounted rename works, and
// `zfs version` says this is OpenZFS, whose rename unmounts first and
// mounts again only where the new mountpoint lets it. zfs-fuse lets a
// mounted rename through now and then, so the probe alone is not enough.
func (c Capabilities) RenameUnmounts() bool { return c.RenameMounted && c.Version }

// probeProp is the user property a probe sets; it never names one of the
// plugin's own properties, so a probe never looks like a managed dataset.
const probeProp = "nomad-device-zfs-probe:"

// Probe learns the Capabilities by trying them on scratch, a dataset that
// must not exist: it creates scratch (mounted where its parent's
// mountpoint puts it), sets two user properties in one `zfs set`, reads
// its encryption property, renames
// it while mounted, runs `zfs version`, and destroys it (plain destroy,
// under whichever name it then has). About five commands, once at start.
// On return the client's SetMany uses what was learned. On error nothing
// is left behind unless the error says so, naming the dataset.
func (c *Client) Probe(ctx context.Context, scratch string) (caps Capabilities, err error) {
	if caps.Implementation, caps.Version, err = c.implementation(ctx); err != nil {
		return caps, err
	}
	if err := c.Create(ctx, scratch, nil); err != nil {
		return caps, fmt.Errorf("probing zfs: %w", err)
	}
	name := scratch
	defer func() {
		if derr := c.Destroy(context.WithoutCancel(ctx), name); derr != nil && !errors.Is(derr, ErrNotExist) {
			err = fmt.Errorf("probing zfs: probe dataset %s could not be destroyed; destroy it by hand: %w (after: %v)", name, derr, err)
		}
	}()

	a, b := probeProp+"a=1", probeProp+"b=1"
	_, serr := c.Runner.ZFSCmd(ctx, "set", a, b, scratch)
	switch {
	case serr == nil:
		caps.MultiSet = true
	case multiSetRefused(serr, []string{b}):
	default:
		return caps, fmt.Errorf("probing zfs: setting two properties of %s: %w", scratch, serr)
	}

	switch _, eerr := c.GetExact(ctx, scratch, "encryption"); {
	case eerr == nil:
		caps.Encryption = true
	case errors.Is(eerr, ErrInvalid): // "bad property list: invalid property 'encryption'"
	default:
		return caps, fmt.Errorf("probing zfs: reading encryption of %s: %w", scratch, eerr)
	}

	mounted, merr := c.GetExact(ctx, scratch, "mounted")
	if merr != nil {
		return caps, fmt.Errorf("probing zfs: %w", merr)
	}
	if mounted.Value == "yes" {
		// Once, without the runner's busy retries: zfs-fuse's refusal
		// of a mounted rename reads "dataset is busy" however long one
		// waits. A passing busy moment on OpenZFS reads as "cannot",
		// which only keeps the unmount-first path, safe everywhere.
		renamed := scratch + "-renamed"
		if err := checkName(renamed); err != nil {
			return caps, err
		}
		_, rerr := c.Runner.runOnce(ctx, orDefault(c.Runner.ZFS, "zfs"), []string{"rename", scratch, renamed}, streams{})
		switch {
		case rerr == nil:
			caps.RenameMounted, name = true, renamed
		case errors.Is(rerr, ErrBusy):
		default:
			return caps, fmt.Errorf("probing zfs: renaming mounted %s: %w", scratch, rerr)
		}
	}
	c.setMultiSet(caps.MultiSet)
	return caps, nil
}

// setMultiSet records what SetMany may use.
func (c *Client) setMultiSet(ok bool) {
	if ok {
		c.multiSet.Store(multiSetSupported)
	} else {
		c.multiSet.Store(multiSetUnsupported)
	}
}
