// Package floor is the driver of the churn benchmark's floor control
// (issue 46): the null device's jobs again, each given a ZFS dataset of
// its own and the dataset taken back at its end, with the bare ZFS work
// any implementation of this product must pay per job and nothing else. Nomad has no release call, so any implementation learns of
// a job's end from the Nomad API; here the floor driver does, in the
// benchmark's process, with blocking queries as the plugin's watcher does.
// Each device has a spare, a dataset made ahead, as each of the plugin's
// slots has. At each floor job's end the driver points the null device's
// link for the device at its spare (bench/nulldevice, handOut: the next
// Reserve of the device binds it, or waits until the link has moved on),
// then runs through the counting wrappers (one at a time: on zfs-fuse the
// runner takes the machine's turn for each command that may mount, as the
// plugin's does):
//
//   - `zfs create -o quota=<the class's> -o mountpoint=… <pool>/floor/<device>-<n>`
//     (it mounts the dataset): the device's next spare;
//   - `zfs destroy` of the ended tenant's dataset, destroyAfter after the
//     driver saw the end, in a run of its own (DestroyLoop), so that
//     the hand-over never waits for it. On zfs-fuse the first destroy of a
//     mounted dataset answers busy nearly every time, at once or a second
//     after the end alike, and the runner's retry 250 ms later destroys
//     it: taking a dataset back costs two processes there, as the
//     plugin's unmount and rename do.
//
// So each job's Reserve binds a mounted dataset of the same pool, with the
// class's quota, made before it was asked for, and its task writes through
// zfs-fuse as a device job's does; what the floor does not do is the
// product's own: archive the dataset, record its owner and state, prove
// the asker. bench/churn runs the floor batches (floor.go) and judges
// the plugin against them (floor_rows.go).
package floor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Bounds of the floor driver's reads and of its wait for a batch's ends.
const (
	readTimeout  = 30 * time.Second // a blocking query's wait is 10 s of it
	blockingWait = 10 * time.Second
	settleWithin = time.Minute
	quota        = "32M" // the churn class's quota (churn.Run's plugin block)
	destroyAfter = time.Second
)

// toDestroy is an ended tenant's dataset, to destroy once due.
type toDestroy struct {
	ds, alloc string
	due       time.Time
}

// Driver makes and takes back the floor jobs' datasets.
type Driver struct {
	api     *api.Client
	zfs     *zfs.Runner // through the counting wrappers
	parent  string      // <pool>/floor
	mounts  string      // where its datasets are mounted
	links   string      // the null device's host_dir: one link per device
	devices []string
	prefix  string // the floor jobs' names begin with it

	// mu guards the fields below; the driver's one goroutine writes them,
	// Settled reads them.
	mu      sync.Mutex
	current map[string]string // device → the dataset its link names
	spare   map[string]string // device → its next tenant's dataset, made
	gen     int
	handled map[string]bool // floor allocations whose dataset was destroyed
	// destroys are the ended tenants' datasets, from Run to DestroyLoop
	// (buffered beyond a run's jobs: Run never waits on it).
	destroys chan toDestroy
	err      error // the first failure, which ends the driver
}

// New makes parent, one dataset per device, and the device's link to it
// (the null device's plain directory set aside). The floor jobs' names
// begin with prefix.
func New(ctx context.Context, c *api.Client, run *zfs.Runner, parent, mounts, links, prefix string, devices []string) (*Driver, error) {
	f := &Driver{api: c, zfs: run, parent: parent, mounts: mounts, links: links, devices: devices,
		prefix: prefix, current: map[string]string{}, spare: map[string]string{}, handled: map[string]bool{},
		destroys: make(chan toDestroy, 4096)}
	if _, err := f.zfs.ZFSCmd(ctx, "create", "-o", "mountpoint="+mounts, parent); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	for _, d := range devices {
		link := filepath.Join(links, d)
		if err := os.Rename(link, link+".null"); err != nil {
			return nil, fmt.Errorf("floor: setting the null device's directory aside: %w", err)
		}
		if err := f.makeSpare(ctx, d); err != nil {
			return nil, err
		}
		if err := f.handOver(ctx, d); err != nil {
			return nil, err
		}
		if err := f.makeSpare(ctx, d); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// mountpoint is where dataset ds is mounted.
func (f *Driver) mountpoint(ds string) string { return filepath.Join(f.mounts, filepath.Base(ds)) }

// makeSpare makes device's next spare: a dataset of the class's quota,
// mounted, its root writable by the task's user.
func (f *Driver) makeSpare(ctx context.Context, device string) error {
	f.mu.Lock()
	f.gen++
	ds := f.parent + "/" + device + "-" + strconv.Itoa(f.gen)
	f.mu.Unlock()
	if _, err := f.zfs.ZFSCmd(ctx, "create", "-o", "quota="+quota, "-o", "mountpoint="+f.mountpoint(ds), ds); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	// The task runs as nobody, as it does in a slot (a syscall, no zfs
	// process).
	if err := os.Chmod(f.mountpoint(ds), 0o777); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	f.mu.Lock()
	f.spare[device] = ds
	f.mu.Unlock()
	return nil
}

// handOver points device's link at its spare (made first when there is
// none), which becomes its current dataset.
func (f *Driver) handOver(ctx context.Context, device string) error {
	f.mu.Lock()
	ds := f.spare[device]
	f.mu.Unlock()
	if ds == "" {
		if err := f.makeSpare(ctx, device); err != nil {
			return err
		}
		return f.handOver(ctx, device)
	}
	link := filepath.Join(f.links, device)
	if err := os.Symlink(f.mountpoint(ds), link+".new"); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	if err := os.Rename(link+".new", link); err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	f.mu.Lock()
	f.current[device], f.spare[device] = ds, ""
	f.mu.Unlock()
	return nil
}

// ended hands device's spare over at the end of its tenant, so that the
// next tenant's Reserve finds it, and returns the ended tenant's dataset,
// to destroy. The next spare is made after every end the same read
// showed has been handed over: the ends of a batch come in waves.
func (f *Driver) ended(ctx context.Context, device string) (string, error) {
	f.mu.Lock()
	old := f.current[device]
	f.mu.Unlock()
	return old, f.handOver(ctx, device)
}

// Run follows the floor jobs' allocations until ctx ends or a step fails
// (then f.err says why), taking back the dataset of each that ended.
func (f *Driver) Run(ctx context.Context, job string) {
	var index uint64
	seen := map[string]bool{} // allocations whose end was handled
	q := &api.QueryOptions{Filter: fmt.Sprintf("JobID matches %q", "^"+regexp.QuoteMeta(f.prefix)+`\d+-`+job+"-"),
		Params: map[string]string{"task_states": "false", "resources": "true"}}
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		q.WaitIndex, q.WaitTime = index, blockingWait
		stubs, meta, err := f.api.Allocations().List(q.WithContext(rctx))
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				f.fail(fmt.Errorf("floor: reading the floor jobs' allocations: %w", err))
			}
			return
		}
		index = meta.LastIndex
		var spares []string // devices whose spare was handed over
		for _, s := range stubs {
			dev := stubDevice(s)
			if !terminal(s.ClientStatus) || dev == "" || seen[s.ID] {
				continue
			}
			old, err := f.ended(ctx, dev)
			if err != nil {
				if ctx.Err() == nil {
					f.fail(fmt.Errorf("allocation %s on %s: %w", s.ID, dev, err))
				}
				return
			}
			seen[s.ID] = true
			f.destroys <- toDestroy{ds: old, alloc: s.ID, due: time.Now().Add(destroyAfter)}
			spares = append(spares, dev)
		}
		for _, dev := range spares {
			if err := f.makeSpare(ctx, dev); err != nil {
				if ctx.Err() == nil {
					f.fail(fmt.Errorf("floor: the spare of %s: %w", dev, err))
				}
				return
			}
		}
	}
}

// DestroyLoop destroys the ended tenants' datasets, each once due, in the
// order of their ends, until ctx ends or a destroy fails (then f.err says
// why). Apart from Run, so that a busy dataset's retries never hold up
// the hand-over of a spare.
func (f *Driver) DestroyLoop(ctx context.Context) {
	for {
		var d toDestroy
		select {
		case <-ctx.Done():
			return
		case d = <-f.destroys:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(d.due)):
		}
		if _, err := f.zfs.ZFSCmd(ctx, "destroy", d.ds); err != nil {
			if ctx.Err() == nil {
				f.fail(fmt.Errorf("floor: allocation %s: %w", d.alloc, err))
			}
			return
		}
		f.mu.Lock()
		f.handled[d.alloc] = true
		f.mu.Unlock()
	}
}

func (f *Driver) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// Settled returns once the dataset of every one of ids was destroyed, or the
// driver failed, or settleWithin passed.
func (f *Driver) Settled(ctx context.Context, ids []string) error {
	deadline := time.Now().Add(settleWithin)
	for {
		f.mu.Lock()
		err, left := f.err, 0
		for _, id := range ids {
			if !f.handled[id] {
				left++
			}
		}
		f.mu.Unlock()
		switch {
		case err != nil:
			return err
		case left == 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("floor: %d of %d allocations' datasets not taken back after %s", left, len(ids), settleWithin)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stubDevice is the null device ID an allocation holds, "" for none.
func stubDevice(s *api.AllocationListStub) string {
	if s.AllocatedResources == nil {
		return ""
	}
	for _, tr := range s.AllocatedResources.Tasks {
		for _, d := range tr.Devices {
			if d.Vendor == "nullbench" && len(d.DeviceIDs) > 0 {
				return d.DeviceIDs[0]
			}
		}
	}
	return ""
}

func terminal(status string) bool {
	return status == api.AllocClientStatusComplete || status == api.AllocClientStatusFailed || status == api.AllocClientStatusLost
}
