package zfs

import (
	"context"
	"errors"
	"fmt"
)

// What SetMany knows about `zfs set` with several properties (Client.multiSet).
const (
	multiSetUnknown int32 = iota
	multiSetSupported
	multiSetUnsupported
)

// SetMany sets several properties of one dataset. Where the ZFS accepts it,
// that is one `zfs set k1=v1 k2=v2 ... name` (keys sorted). Otherwise it is
// one `zfs set k=v name` per property, in key order, stopping at the first
// failure, whose error it returns (wrapped, still matching the sentinels and
// *Error; it names the property it stopped at): the properties before that
// one are set, that one and the later ones are not known to be. A nil error
// means every property is set; a non-nil one never hides a partial write.
//
// Which form works is learned from the ZFS itself, once per Client: the first
// call with more than one property runs the multi-property form.
//
//   - OpenZFS (zfs-set(8) of 2.x: `zfs set property=value
//     [property=value]... dataset`; from illumos issue 5745) takes them in
//     one command, one ioctl. libzfs checks every value before that ioctl,
//     so a bad value writes nothing; a refusal by the kernel (a refquota
//     below what is used) may leave others set, and is returned as an error.
//     Tested in the OpenZFS VM (make test-openzfs; TestProbe checks that
//     two properties take one process there).
//   - zfs-fuse 0.7 takes one property: it reads the next "k=v" arguments as
//     dataset names. It sets the FIRST property, then fails with "cannot
//     open 'k=v': invalid dataset name" for each other one. SetMany sees
//     that complaint about its own arguments, remembers that the form is
//     unsupported, and sets every property one by one (the first again,
//     to the same value).
//
// Any other failure of the multi-property form (ErrNotExist, ErrNoSpace,
// ErrInvalid for a bad value) is returned as it is and teaches nothing.
func (c *Client) SetMany(ctx context.Context, name string, props map[string]string) error {
	if err := checkName(name); err != nil {
		return err
	}
	keys := sortedKeys(props)
	assigns := make([]string, 0, len(keys))
	for _, k := range keys {
		if err := checkProp(k); err != nil {
			return err
		}
		assigns = append(assigns, k+"="+props[k])
	}
	if len(assigns) == 0 {
		return nil
	}
	if len(assigns) > 1 && c.multiSet.Load() != multiSetUnsupported {
		args := append(append([]string{"set"}, assigns...), name)
		_, err := c.Runner.ZFSCmd(ctx, args...)
		if err == nil {
			c.multiSet.Store(multiSetSupported)
			return nil
		}
		if !multiSetRefused(err, assigns[1:]) {
			return err
		}
		c.multiSet.Store(multiSetUnsupported)
		if c.Runner.Logger != nil {
			c.Runner.Logger.Debug("zfs set takes one property at a time here; setting them one by one", "dataset", name)
		}
	}
	for i, a := range assigns {
		if _, err := c.Runner.ZFSCmd(ctx, "set", a, name); err != nil {
			if len(assigns) == 1 {
				return err
			}
			return fmt.Errorf("setting %d properties of %s one by one: stopped at %s, the %d before it are set: %w",
				len(assigns), name, keys[i], i, err)
		}
	}
	return nil
}

// multiSetRefused reports whether a multi-property `zfs set` failed because
// the ZFS read the extra "k=v" arguments as dataset names.
func multiSetRefused(err error, extra []string) bool {
	var zerr *Error
	if !errors.As(err, &zerr) || zerr.ExitCode <= 0 {
		return false
	}
	for _, a := range extra {
		if treatedAsDataset(zerr.Stderr, a) {
			return true
		}
	}
	return false
}
