package zfs

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
)

// Client offers the few zfs operations the plugin needs, each one process
// (SetMany: one process where the ZFS allows it). Its methods are safe for
// concurrent use. A Client must not be copied after first use.
type Client struct {
	Runner *Runner

	// multiSet is what the ZFS did with a `zfs set` of several properties:
	// multiSetUnknown until SetMany has seen it succeed or be refused.
	multiSet atomic.Int32
}

// NewClient returns a client that runs commands through r.
func NewClient(r *Runner) *Client { return &Client{Runner: r} }

// Get runs one `zfs get -H -p -o name,property,value,source` of props over
// name. With depth > 0 it recurses that many levels (`-r -d depth`); with
// depth < 0 it recurses fully; with 0 it reads name alone. Snapshots are left
// out of the result. A dataset whose lines do not parse cleanly (a value
// with a newline) comes back with Err set and must not be trusted; the
// others are read normally (see ParseGet).
func (c *Client) Get(ctx context.Context, name string, depth int, props ...string) ([]Dataset, error) {
	var recurse []string
	switch {
	case depth > 0:
		recurse = []string{"-r", "-d", strconv.Itoa(depth)}
	case depth < 0:
		recurse = []string{"-r"}
	}
	return c.get(ctx, recurse, []string{name}, props)
}

// GetNames runs one `zfs get -H -p -o name,property,value,source` of props
// over the named datasets, without recursion: a read whose cost does not
// depend on how many other datasets the pool holds. If any of them does not
// exist the error matches ErrNotExist and no result is returned. Snapshots
// are left out of the result; Dataset.Err is as for Get.
func (c *Client) GetNames(ctx context.Context, names []string, props ...string) ([]Dataset, error) {
	return c.get(ctx, nil, names, props)
}

// get runs `zfs get -H -p -o name,property,value,source [recurse...] props
// name names...` and parses its output. Names are passed sorted and once
// each (zfs-fuse prints a name given twice twice). "name" is asked for last,
// so that no value that a tenant or an operator wrote can forge a dataset
// (see ParseGet); it is left out of the result unless props holds it.
func (c *Client) get(ctx context.Context, recurse, names, props []string) ([]Dataset, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("zfs get: no datasets named")
	}
	for _, n := range names {
		if err := checkName(n); err != nil {
			return nil, err
		}
	}
	if len(props) == 0 {
		return nil, fmt.Errorf("zfs get %s: no properties asked for", strings.Join(names, " "))
	}
	for _, p := range props {
		if err := checkProp(p); err != nil {
			return nil, err
		}
	}
	names = slices.Compact(slices.Sorted(slices.Values(names)))
	keepName := slices.Contains(props, "name")
	query := append(slices.DeleteFunc(slices.Clone(props), func(p string) bool { return p == "name" }), "name")
	args := append([]string{"get", "-H", "-p", "-o", "name,property,value,source"}, recurse...)
	args = append(append(args, strings.Join(query, ",")), names...)
	out, err := c.Runner.ZFSCmd(ctx, args...)
	if err != nil {
		return nil, err
	}
	ds, err := ParseGet(out, query)
	if err != nil {
		return nil, &Error{Args: append([]string{orDefault(c.Runner.ZFS, "zfs")}, args...), Kind: ErrMalformed, Err: err}
	}
	if !keepName {
		for _, d := range ds {
			delete(d.Props, "name")
		}
	}
	return ds, nil
}

// GetExact runs `zfs get -H -p -o value,source prop name` and returns the
// property exactly, even a value that holds TABs and newlines (which a
// `zfs get` of several datasets cannot carry unambiguously). It costs one
// process per property: use it to repair a Dataset whose Err is set.
func (c *Client) GetExact(ctx context.Context, name, prop string) (Prop, error) {
	if err := checkName(name); err != nil {
		return Prop{}, err
	}
	if err := checkProp(prop); err != nil {
		return Prop{}, err
	}
	args := []string{"get", "-H", "-p", "-o", "value,source", prop, name}
	out, err := c.Runner.ZFSCmd(ctx, args...)
	if err != nil {
		return Prop{}, err
	}
	p, err := ParseGetExact(out)
	if err != nil {
		return Prop{}, &Error{Args: append([]string{orDefault(c.Runner.ZFS, "zfs")}, args...), Kind: ErrMalformed, Err: err}
	}
	return p, nil
}

// Create runs `zfs create -o k=v ... name`, with the properties in sorted
// order. It does not create missing parents.
func (c *Client) Create(ctx context.Context, name string, props map[string]string) error {
	if err := checkName(name); err != nil {
		return err
	}
	args := []string{"create"}
	for _, k := range sortedKeys(props) {
		if err := checkProp(k); err != nil {
			return err
		}
		args = append(args, "-o", k+"="+props[k])
	}
	args = append(args, name)
	_, err := c.Runner.ZFSCmd(ctx, args...)
	return err
}

// Set runs `zfs set prop=value name`.
func (c *Client) Set(ctx context.Context, name, prop, value string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkProp(prop); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "set", prop+"="+value, name)
	return err
}

// Destroy runs `zfs destroy name`: never -f, never -r. A dataset with
// snapshots or children fails, and so does one that is busy (after the
// runner's bounded retries).
func (c *Client) Destroy(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "destroy", name)
	return err
}

// DestroyRecursive runs `zfs destroy -r name` (never -f, never -R), and only
// for a dataset strictly below within: the plugin destroys recursively only
// inside its own archive tree.
func (c *Client) DestroyRecursive(ctx context.Context, name, within string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if within == "" || !strings.HasPrefix(name, within+"/") {
		return &Error{Args: []string{"zfs", "destroy", "-r", name}, Kind: ErrInvalid,
			Err: fmt.Errorf("refusing a recursive destroy of %s outside %s", name, within)}
	}
	_, err := c.Runner.ZFSCmd(ctx, "destroy", "-r", name)
	return err
}

// Unmount runs `zfs unmount name` (never -f). A busy dataset is retried by
// the runner, then reported as ErrBusy.
func (c *Client) Unmount(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "unmount", name)
	return err
}

// Rename runs `zfs rename from to`. zfs-fuse cannot rename a mounted
// dataset, and calls one busy for a moment after an unmount: unmount first;
// the runner retries the busy moments.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	if err := checkName(from); err != nil {
		return err
	}
	if err := checkName(to); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "rename", from, to)
	return err
}

// Mount runs `zfs mount name`.
func (c *Client) Mount(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "mount", name)
	return err
}

// MountLoadKey runs `zfs mount -l name`: it loads the dataset's key from
// its keylocation first when it is not loaded (after a reboot). For
// encrypted datasets; zfs-fuse has no -l.
func (c *Client) MountLoadKey(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "mount", "-l", name)
	return err
}

// PoolHealth runs `zpool list -H -o name,health pool` and returns the health.
func (c *Client) PoolHealth(ctx context.Context, pool string) (string, error) {
	if err := checkName(pool); err != nil {
		return "", err
	}
	out, err := c.Runner.ZpoolCmd(ctx, "list", "-H", "-o", "name,health", pool)
	if err != nil {
		return "", err
	}
	return ParsePoolHealth(out, pool)
}

// checkName refuses names that zfs would read as an option.
func checkName(name string) error {
	if name == "" || strings.HasPrefix(name, "-") {
		return &Error{Args: []string{"zfs"}, Kind: ErrInvalid, Err: fmt.Errorf("invalid dataset name %q", name)}
	}
	return nil
}

// checkProp refuses property names that zfs would read as an option, or
// that would break a comma-separated list or a "prop=value" argument.
func checkProp(prop string) error {
	if prop == "" || strings.HasPrefix(prop, "-") || strings.ContainsAny(prop, ",= \t\n") {
		return &Error{Args: []string{"zfs"}, Kind: ErrInvalid, Err: fmt.Errorf("invalid property name %q", prop)}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// PoolOf returns the pool part of a dataset name ("tank" for "tank/a/b").
func PoolOf(dataset string) string {
	pool, _, _ := strings.Cut(dataset, "/")
	return pool
}

// ValidateDatasetName reports whether name is a well-formed filesystem name:
// components of letters, digits, '_', '-', '.', ':' separated by single '/',
// none empty, none "." or "..", and not starting with '-'.
func ValidateDatasetName(name string) error {
	if name == "" {
		return fmt.Errorf("dataset name is empty")
	}
	if strings.HasPrefix(name, "-") {
		return fmt.Errorf("dataset name %q starts with '-'", name)
	}
	if strings.ContainsAny(name, "@#") {
		return fmt.Errorf("dataset name %q names a snapshot or bookmark, not a filesystem", name)
	}
	for _, comp := range strings.Split(name, "/") {
		if comp == "" || comp == "." || comp == ".." {
			return fmt.Errorf("dataset name %q has an empty, '.' or '..' component", name)
		}
		for _, r := range comp {
			ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
				r == '_' || r == '-' || r == '.' || r == ':'
			if !ok {
				return fmt.Errorf("dataset name %q has the character %q, which zfs does not allow", name, r)
			}
		}
	}
	return nil
}
