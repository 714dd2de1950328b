package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// The release and Reserve measures of a size run: the plugin against the
// zfs commands that are their floor.

// release times the release of a slot whose allocation has ended (its
// dataset archived, a fresh one in its place, owner and mode set) against
// the raw CLI sequence for the same work on a dataset of the same kind
// outside the plugin's parent, interleaved; then counts the processes of
// further releases through the wrapper. It uses slots 0 and 1 and leaves
// them free.
func (h *sizeRun) release(ctx context.Context) error {
	// The release takes the path the plugin takes on this ZFS: where a
	// rename unmounts (OpenZFS), no `zfs unmount` of its own, into an
	// archive with mountpoint=none (device.Plugin.SetConfig probes the
	// same way).
	caps, err := zfs.NewClient(&zfs.Runner{}).Probe(ctx, h.parent+"/.bench-caps")
	if err != nil {
		return fmt.Errorf("probing zfs: %w", err)
	}
	renameUnmounts := caps.RenameUnmounts()
	cfg := SlotsConfig(h.parent, h.n)
	cfg.RenameUnmounts = renameUnmounts
	tenants := NewTenants()
	mgr := slots.NewManager(zfs.NewClient(&zfs.Runner{}), hclog.NewNullLogger())
	// No task starts here: the release timed right behind a Reserve is
	// ZFS's work, not a wait for a start it yields to.
	mgr.SetStartYield(0)
	mgr.SetNomad(tenants)
	mgr.SetConfig(cfg)
	if err := mgr.Sync(ctx); err != nil {
		return err
	}
	// The fresh datasets an earlier run made armed are adopted by the first
	// pass that finds nobody holding them (internal/slots/armed.go).
	if err := mgr.ReleaseEnded(ctx); err != nil {
		return err
	}

	// The floor: a dataset made like a slot, and an archive container, and
	// the same commands the plugin's release runs on this ZFS.
	floorDS, floorArchive := h.pool.Dataset("floorrel"), h.pool.Dataset("floorarch")
	floorMP := filepath.Join(h.pool.Mountpoint, "floorrel")
	props := benchProps(cfg.Classes[0].SlotProps())
	// zfs-fuse refuses a mounted rename: the release unmounts by
	// `zfs set canmount=off` (one process for the unmount and the
	// canmount); where the rename unmounts, canmount=noauto alone.
	archiveProp, canmount, unmountNote := "canmount=off", "canmount=off", "the unmount by canmount=off, "
	if renameUnmounts {
		archiveProp, canmount, unmountNote = "mountpoint=none", "canmount=noauto", "canmount=noauto (the rename unmounts), "
	}
	if _, err := h.floor.ZFSCmd(ctx, "create", "-o", archiveProp, floorArchive); err != nil {
		return err
	}
	if _, err := h.floor.ZFSCmd(ctx, createArgs(floorDS, props)...); err != nil {
		return err
	}
	floorSeq := 0
	floor := func() (time.Duration, error) {
		floorSeq++
		if err := waitMounted(floorMP); err != nil {
			return 0, err
		}
		if err := os.WriteFile(filepath.Join(floorMP, "data"), []byte("floor"), 0o644); err != nil {
			return 0, err
		}
		start := time.Now()
		for _, args := range [][]string{
			{"set", "zfsbench:released-at=" + time.Now().UTC().Format(time.RFC3339), floorDS},
			{"set", canmount, floorDS},
			{"rename", floorDS, fmt.Sprintf("%s/rel-%d", floorArchive, floorSeq)},
			createArgs(floorDS, props),
		} {
			if _, err := h.floor.ZFSCmd(ctx, args...); err != nil {
				return 0, err
			}
		}
		if err := waitMounted(floorMP); err != nil {
			return 0, err
		}
		if err := os.Chown(floorMP, ownerUID, ownerGID); err != nil {
			return 0, err
		}
		if err := os.Chmod(floorMP, classMode); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	pluginSeq := 0
	plugin := func() (time.Duration, error) {
		id := DeviceID(pluginSeq % 2)
		pluginSeq++
		o, err := Tenancy(ctx, mgr, tenants, id)
		if err != nil {
			return 0, err
		}
		return TimedRelease(ctx, mgr, tenants, id, o)
	}
	ps, fs, err := interleave(h.o.Reps, plugin, floor)
	if err != nil {
		return err
	}
	row := timeRow("release", "release → fresh slot (p50)", Median(ps), Median(fs), ps, fs, "",
		"one release pass (ReleaseEnded) after the owner ended: the dataset's fate recorded (state; the slot's spare serves from then on), "+unmountNote+"rename into .archive; the fresh dataset is the spare, made (and given owner and mode) behind the tenant's Reserve, outside the timing; "+
			"floor: the same zfs commands by hand (set release time, "+unmountNote+"rename, create) + chown/chmod, without the plugin's state marks and reads", nil)
	row.RatioOfMedians, row.Ratio = row.Ratio, pairedRatio(ps, fs)
	h.rows = append(h.rows, row)

	// Processes per release, through the counting wrapper.
	c, done, err := h.newCounter()
	if err != nil {
		return err
	}
	defer done()
	counted := slots.NewManager(zfs.NewClient(c.Runner()), hclog.NewNullLogger())
	counted.SetNomad(tenants)
	counted.SetConfig(cfg)
	if err := counted.Sync(ctx); err != nil {
		return err
	}
	if err := counted.ReleaseEnded(ctx); err != nil { // adopts (as above)
		return err
	}
	var seen []Counts
	for k := 0; k < countRefreshes; k++ {
		id := DeviceID(k % 2)
		o, err := Tenancy(ctx, counted, tenants, id)
		if err != nil {
			return err
		}
		got, err := c.Count(func() error {
			_, err := TimedRelease(ctx, counted, tenants, id, o)
			return err
		})
		if err != nil {
			return err
		}
		seen = append(seen, got)
	}
	want := Counts{"zfs set": 2, "zfs rename": 1}
	h.addCountRow("procs-release", "zfs processes per release (its fresh dataset is the spare, made at Reserve)", seen,
		want,
		"the same at every size: nothing read recursively", nil)
	return nil
}

// benchProps are props with the plugin's own user properties renamed, so
// that a floor dataset is made like a slot but is never taken for one.
func benchProps(props map[string]string) map[string]string {
	out := make(map[string]string, len(props))
	for k, v := range props {
		out[strings.Replace(k, "nomad-device-zfs:", "zfsbench:", 1)] = v
	}
	return out
}

// createArgs is `zfs create` of name with props, in sorted order.
func createArgs(name string, props map[string]string) []string {
	args := []string{"create"}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		args = append(args, "-o", k+"="+props[k])
	}
	return append(args, name)
}

// waitMounted waits for dir to become a mount point (zfs-fuse mounts a
// new dataset shortly after `zfs create` returns).
func waitMounted(dir string) error {
	for deadline := time.Now().Add(10 * time.Second); !Mounted(dir); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not a mount point after 10s", dir)
		}
	}
	return nil
}

// reserve times Reserve on free slots against one `zfs set` of a user
// property, and against `zfs create` + mount of a new dataset (what a
// create-on-demand plugin must do), all interleaved.
func (h *sizeRun) reserve(ctx context.Context) error {
	r := &zfs.Runner{}
	p, err := NewPlugin(r)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := Configure(ctx, p.Conn, h.config("1h", "1h")); err != nil {
		return err
	}
	stop, err := FirstFingerprint(p.Conn, h.n, 10*time.Minute)
	if err != nil {
		return err
	}
	stop()
	if err := p.Adopt(ctx); err != nil { // the earlier runs' armed datasets
		return err
	}

	// The floor's `zfs set` goes to the slots' datasets, as they are named
	// now: a release (the step before) leaves a slot's dataset under a new
	// name.
	out, err := h.floor.ZFSCmd(ctx, "list", "-H", "-o", "name", "-d", "1", SlotsConfig(h.parent, h.n).ClassDataset(ClassName))
	if err != nil {
		return err
	}
	datasets := strings.Fields(strings.TrimSpace(string(out)))
	if len(datasets) < 2 {
		return fmt.Errorf("no slot datasets listed under %s: %q", SlotsConfig(h.parent, h.n).ClassDataset(ClassName), out)
	}
	datasets = datasets[1:] // the class dataset itself comes first

	// The same number of properties, none of them the plugin's own.
	props := benchProps(SlotsConfig(h.parent, h.n).Classes[0].SlotProps())

	var reserves, sets, creates []time.Duration
	maxProcs := int64(0)
	idx := h.timedIndexes()
	for k, i := range idx {
		doReserve := func() error {
			before := r.Runs()
			start := time.Now()
			res, err := Reserve(ctx, p.Conn, DeviceID(i))
			d := time.Since(start)
			if err != nil {
				return err
			}
			maxProcs = max(maxProcs, r.Runs()-before)
			if m := res.GetMounts(); len(m) != 1 || !Mounted(m[0].GetHostPath()) {
				return fmt.Errorf("Reserve(%s) did not return one mounted host path: %v", DeviceID(i), m)
			}
			reserves = append(reserves, d)
			// The spare is made behind the Reserve: not timed, and not
			// left to run into the next measurement.
			return p.Settle(ctx)
		}
		doSet := func() error {
			start := time.Now()
			_, err := h.floor.ZFSCmd(ctx, "set", "zfsbench:probe=x", datasets[k%len(datasets)])
			sets = append(sets, time.Since(start))
			return err
		}
		doCreate := func() error {
			name := h.pool.Dataset("floor/" + strconv.Itoa(k))
			mp := filepath.Join(h.pool.Mountpoint, "floor", strconv.Itoa(k))
			start := time.Now()
			if _, err := h.floor.ZFSCmd(ctx, createArgs(name, props)...); err != nil {
				return err
			}
			if !Mounted(mp) {
				if _, err := h.floor.ZFSCmd(ctx, "mount", name); err != nil && !Mounted(mp) {
					return err
				}
			}
			if err := waitMounted(mp); err != nil {
				return fmt.Errorf("%s after create: %w", name, err)
			}
			creates = append(creates, time.Since(start))
			return nil
		}
		order := []func() error{doReserve, doSet}
		if k%2 == 1 {
			order = []func() error{doSet, doReserve}
		}
		if k < h.o.Creates {
			// Rotate the create into each of the three positions.
			pos := k % 3
			order = append(order[:pos], append([]func() error{doCreate}, order[pos:]...)...)
		}
		for _, f := range order {
			if err := f(); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	note := fmt.Sprintf("%d Reserve calls on free slots, %d `zfs set` on the slots' datasets in turn, interleaved; at most %d zfs processes from the Reserve's start to its return (Runner.Runs; the spare's create may start before it returns), waited for (untimed) before the next", len(reserves), len(sets), maxProcs)
	p50r, p50s := Median(reserves), Median(sets)
	p99r, p99s := Percentile(reserves, 99), Percentile(sets, 99)
	h.rows = append(h.rows,
		timeRow("reserve-p50", "Reserve on a free slot, p50", p50r, p50s, reserves, sets, "", note, nil),
		timeRow("reserve-p99", "Reserve on a free slot, p99", p99r, p99s, nil, nil, "≤ 1.5× zfs set", "nearest-rank p99 of the same samples", ratioMax(1.5)),
		timeRow("mount-ready", "Reserve → mount ready, versus create-on-demand (p50)", p50r, Median(creates), nil, creates,
			"≤ 0.5× create+mount",
			fmt.Sprintf("floor: `zfs create` with the slot's %d properties + mount, %d new datasets; Reserve returns a dataset that is already mounted (checked after each call)", len(props), len(creates)),
			ratioMax(0.5)),
	)
	return nil
}
