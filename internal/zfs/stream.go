package zfs

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// checkSnapshot refuses anything but dataset@snapshot, with the snapshot's
// name free of what zfs would read otherwise.
func checkSnapshot(name string) error {
	ds, snap, ok := strings.Cut(name, "@")
	if !ok || snap == "" || strings.ContainsAny(snap, "@/# \t\n") || checkName(ds) != nil {
		return &Error{Args: []string{"zfs"}, Kind: ErrInvalid, Err: fmt.Errorf("invalid snapshot name %q", name)}
	}
	return nil
}

// Snapshot runs `zfs snapshot name` (dataset@snapshot).
func (c *Client) Snapshot(ctx context.Context, name string) error {
	if err := checkSnapshot(name); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "snapshot", name)
	return err
}

// DestroySnapshot runs `zfs destroy dataset@snapshot` (never -r, -R or -f):
// a snapshot with clones or holds is refused by ZFS, and kept.
func (c *Client) DestroySnapshot(ctx context.Context, name string) error {
	if err := checkSnapshot(name); err != nil {
		return err
	}
	_, err := c.Runner.ZFSCmd(ctx, "destroy", name)
	return err
}

// SnapshotGUID returns the GUID of a snapshot (dataset@snapshot), which is
// the same on every pool that received it.
func (c *Client) SnapshotGUID(ctx context.Context, name string) (uint64, error) {
	if err := checkSnapshot(name); err != nil {
		return 0, err
	}
	p, err := c.GetExact(ctx, name, "guid")
	if err != nil {
		return 0, err
	}
	g, perr := strconv.ParseUint(p.Value, 10, 64)
	if perr != nil {
		return 0, &Error{Args: []string{"zfs", "get", "guid", name}, Kind: ErrMalformed, Err: fmt.Errorf("guid %q: %w", p.Value, perr)}
	}
	return g, nil
}

// Send writes `zfs send -p [-i base] snapshot` to w: the snapshot with the
// dataset's properties (the plugin's marks among them), incremental from
// base (a snapshot of the same dataset, "@name" or "dataset@name") when base
// is not empty. ctx must have a deadline (see ZFSStream).
func (c *Client) Send(ctx context.Context, snapshot, base string, w io.Writer) error {
	return c.send(ctx, []string{"send", "-p"}, snapshot, base, w)
}

// SendRaw is Send of an encrypted dataset: `zfs send -w -p`, the blocks
// as they are on disk (still encrypted: the stream holds no key, and the
// received dataset needs the sender's key to be opened).
func (c *Client) SendRaw(ctx context.Context, snapshot, base string, w io.Writer) error {
	return c.send(ctx, []string{"send", "-w", "-p"}, snapshot, base, w)
}

func (c *Client) send(ctx context.Context, args []string, snapshot, base string, w io.Writer) error {
	if err := checkSnapshot(snapshot); err != nil {
		return err
	}
	if base != "" {
		if strings.HasPrefix(base, "@") {
			base = strings.SplitN(snapshot, "@", 2)[0] + base
		}
		if err := checkSnapshot(base); err != nil {
			return err
		}
		args = append(args, "-i", base)
	}
	return c.Runner.ZFSStream(ctx, nil, w, append(args, snapshot)...)
}

// Receive runs `zfs receive -u target` with the stream read from r: a full
// stream creates target, an incremental one adds to it. -u: nothing is
// mounted. ctx must have a deadline (see ZFSStream). A stream that is cut
// short or damaged is refused by zfs, and nothing of it is kept.
func (c *Client) Receive(ctx context.Context, target string, r io.Reader) error {
	if err := checkName(target); err != nil {
		return err
	}
	return c.Runner.ZFSStream(ctx, r, nil, "receive", "-u", target)
}

// Snap is one snapshot of a dataset.
type Snap struct {
	Name string // dataset@name
	GUID uint64
}

// Snapshots lists the snapshots of dataset (not of its children), oldest
// first, with one `zfs get -H -p -o name,property,value -r -d 1
// guid,createtxg` (zfs-fuse's `zfs list` has no -p, and neither knows guid
// there).
func (c *Client) Snapshots(ctx context.Context, dataset string) ([]Snap, error) {
	if err := checkName(dataset); err != nil {
		return nil, err
	}
	args := []string{"get", "-H", "-p", "-o", "name,property,value", "-r", "-d", "1", "guid,createtxg", dataset}
	out, err := c.Runner.ZFSCmd(ctx, args...)
	if err != nil {
		return nil, err
	}
	snaps, perr := ParseSnapshots(out, dataset)
	if perr != nil {
		return nil, &Error{Args: append([]string{orDefault(c.Runner.ZFS, "zfs")}, args...), Kind: ErrMalformed, Err: perr}
	}
	return snaps, nil
}

// ParseSnapshots parses `zfs get -H -p -o name,property,value -r -d 1
// guid,createtxg dataset`: three tab-separated fields a line. It returns
// dataset's snapshots (dataset@name) oldest first (by createtxg), each with
// both properties; the dataset's own lines are skipped.
func ParseSnapshots(out []byte, dataset string) ([]Snap, error) {
	by, err := parseSnapshotRows(out, func(name string) (bool, error) {
		if name == dataset {
			return false, nil
		}
		if !strings.HasPrefix(name, dataset+"@") {
			return false, fmt.Errorf("%q is not %s or a snapshot of it", name, dataset)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return by[dataset], nil
}

// SnapshotsUnder lists the snapshots of every dataset directly under
// container (not of the container, nor deeper), by dataset, each oldest
// first, with one `zfs get -H -p -o name,property,value -r -d 2
// guid,createtxg container`.
func (c *Client) SnapshotsUnder(ctx context.Context, container string) (map[string][]Snap, error) {
	if err := checkName(container); err != nil {
		return nil, err
	}
	args := []string{"get", "-H", "-p", "-o", "name,property,value", "-r", "-d", "2", "guid,createtxg", container}
	out, err := c.Runner.ZFSCmd(ctx, args...)
	if err != nil {
		return nil, err
	}
	by, perr := ParseSnapshotsUnder(out, container)
	if perr != nil {
		return nil, &Error{Args: append([]string{orDefault(c.Runner.ZFS, "zfs")}, args...), Kind: ErrMalformed, Err: perr}
	}
	return by, nil
}

// ParseSnapshotsUnder parses SnapshotsUnder's read: the snapshots of the
// datasets directly under container, by dataset, each oldest first; the
// datasets' own lines and the container's snapshots are skipped.
func ParseSnapshotsUnder(out []byte, container string) (map[string][]Snap, error) {
	return parseSnapshotRows(out, func(name string) (bool, error) {
		rest, ok := strings.CutPrefix(name, container+"/")
		switch {
		case name == container || strings.HasPrefix(name, container+"@"):
			return false, nil
		case !ok:
			return false, fmt.Errorf("%q is not under %s", name, container)
		}
		leaf, _, snap := strings.Cut(rest, "@")
		return snap && !strings.Contains(leaf, "/"), nil
	})
}

// parseSnapshotRows parses three tab-separated fields a line (name,
// property guid or createtxg, value) into the snapshots accept takes (an
// error from it is the line's), by dataset, each oldest first.
func parseSnapshotRows(out []byte, accept func(name string) (bool, error)) (map[string][]Snap, error) {
	type row struct {
		guid, txg uint64
		has       int
	}
	rows := map[string]*row{}
	var order []string
	for i, line := range strings.Split(string(out), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: want 3 tab-separated fields (name, property, value), got %d: %q", i+1, len(f), line)
		}
		ok, err := accept(f[0])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: %s %q: %w", i+1, f[1], f[2], err)
		}
		r, ok := rows[f[0]]
		if !ok {
			r = &row{}
			rows[f[0]] = r
			order = append(order, f[0])
		}
		switch f[1] {
		case "guid":
			r.guid = n
		case "createtxg":
			r.txg = n
		default:
			return nil, fmt.Errorf("line %d: unexpected property %q", i+1, f[1])
		}
		r.has++
	}
	by := map[string][]Snap{}
	for _, name := range order {
		r := rows[name]
		if r.has != 2 {
			return nil, fmt.Errorf("%s: want guid and createtxg, got %d value(s)", name, r.has)
		}
		ds, _, _ := strings.Cut(name, "@")
		by[ds] = append(by[ds], Snap{Name: name, GUID: r.guid})
	}
	for _, snaps := range by {
		sort.SliceStable(snaps, func(i, j int) bool { return rows[snaps[i].Name].txg < rows[snaps[j].Name].txg })
	}
	return by, nil
}
