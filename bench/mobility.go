package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/sandbox"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// MobilityOptions configures RunMobility.
type MobilityOptions struct {
	// Reps is how many restores and how many send/receive rounds are timed.
	Reps int
	// DataMiB is how much random data the tenant leaves in its dataset.
	DataMiB int
	WorkDir string
	// Progress receives a line per step; nil for none.
	Progress io.Writer
}

// MobilityResult is what RunMobility measured: the cost of the data
// following a job, against the raw ZFS work of the same.
type MobilityResult struct {
	Reps    int `json:"reps"`
	DataMiB int `json:"data_mib"`
	// Restore on the same node: Reserve of a fresh slot whose asker's
	// identity has an archive (the archive renamed in, marked, mounted),
	// against `zfs rename` of the same archive plus `zfs mount`.
	RestoreP50      time.Duration `json:"restore_p50_ns"`
	RestoreFloorP50 time.Duration `json:"restore_floor_p50_ns"`
	RestoreRatio    float64       `json:"restore_ratio"`
	// RestoreProcs is the zfs/zpool processes of one restore.
	RestoreProcs float64 `json:"restore_procs"`
	// Another node: the keeper's send into backup_dir (stream, sha256,
	// fsync, manifest) plus the other node's Fetch (verify, receive),
	// against `zfs send -p | zfs receive -u` of the same snapshot between
	// the same two pools.
	MoveP50      time.Duration `json:"move_p50_ns"`
	MoveFloorP50 time.Duration `json:"move_floor_p50_ns"`
	MoveRatio    float64       `json:"move_ratio"`
	MoveMiBps    float64       `json:"move_mib_per_s"`
	FloorMiBps   float64       `json:"floor_mib_per_s"`
	Error        string        `json:"error,omitempty"`
}

// RunMobility measures restore on the same node and the move through
// backup_dir on two pools of its own (ZFS must answer: see
// sandbox.StartFuse). It returns what it measured, with Error set when a
// step failed.
func RunMobility(ctx context.Context, o MobilityOptions) (*MobilityResult, error) {
	r := &MobilityResult{Reps: o.Reps, DataMiB: o.DataMiB}
	logf := mobilityLog(o)
	if err := r.restore(ctx, o, logf); err != nil {
		r.Error = err.Error()
		return r, err
	}
	if err := r.move(ctx, o, logf); err != nil {
		r.Error = err.Error()
		return r, err
	}
	return r, nil
}

// RunMove measures the move through backup_dir alone (RunMobility's
// second half, the Move fields): the keeper's send and the other pool's
// Fetch of o.DataMiB of random data, against `zfs send -p | zfs receive
// -u` of the same snapshot between the same two pools, in pairs. Another
// scenario reports it beside its own figures, so that its send throughput
// has its floor from the same run.
func RunMove(ctx context.Context, o MobilityOptions) (*MobilityResult, error) {
	r := &MobilityResult{Reps: o.Reps, DataMiB: o.DataMiB}
	if err := r.move(ctx, o, mobilityLog(o)); err != nil {
		r.Error = err.Error()
		return r, err
	}
	return r, nil
}

// mobilityLog writes a line per step to o.Progress (none when nil).
func mobilityLog(o MobilityOptions) func(string, ...any) {
	return func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "mobility: "+format+"\n", args...)
		}
	}
}

// mobilityPool makes a pool of its own under dir, with a parent dataset.
func mobilityPool(ctx context.Context, dir, name string) (*sandbox.Pool, func(), error) {
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, nil, err
	}
	p, err := sandbox.CreatePool(ctx, d, "ndzm", 1<<30)
	if err != nil {
		return nil, nil, err
	}
	done := func() { _ = p.Destroy(); _ = os.RemoveAll(d) }
	if _, err := p.Runner.ZFSCmd(ctx, "create", p.Dataset("nomad")); err != nil {
		done()
		return nil, nil, err
	}
	return p, done, nil
}

func (r *MobilityResult) restore(ctx context.Context, o MobilityOptions, logf func(string, ...any)) error {
	p, done, err := mobilityPool(ctx, o.WorkDir, "restore")
	if err != nil {
		return err
	}
	defer done()
	cfg := slots.Config{Parent: p.Dataset("nomad"), Classes: []slots.Class{{Name: "state", Slots: 1, Quota: 512 << 20,
		UID: 65534, GID: 65534, Mode: 0o770, OnRelease: slots.OnReleaseArchive, Restore: slots.RestoreRequired}}}
	runner := &zfs.Runner{}
	client := zfs.NewClient(runner)
	mgr := slots.NewManager(client, hclog.NewNullLogger())
	mgr.SetStartYield(0) // no task starts here (see handover.go)
	mgr.SetConfig(cfg)
	pruner := retention.New(client, hclog.NewNullLogger())
	pruner.SetConfig(retention.Config{Container: cfg.ArchiveDataset(), Rules: retention.Rules{Default: retention.Policy{Keep: 3}}})
	mgr.SetArchives(pruner)
	t := NewTenants()
	mgr.SetNomad(t)
	defer func() { _ = mgr.Wait(context.Background()) }()
	if err := mgr.Sync(ctx); err != nil {
		return err
	}
	const id = "state-0"
	// The first tenant writes the data; each next one, of the same
	// identity, gets it back from the archive.
	var samples []time.Duration
	var procs int64
	for i := 0; i <= o.Reps; i++ {
		ten := t.HoldAs(id, 0)
		start, runs := time.Now(), runner.Runs()
		res, err := mgr.Reserve(ctx, []string{id})
		took, ran := time.Since(start), runner.Runs()-runs
		if err != nil {
			return fmt.Errorf("reserve %d: %w", i, err)
		}
		if i == 0 {
			if err := writeRandom(filepath.Join(res[0].Mountpoint, "data"), o.DataMiB); err != nil {
				return err
			}
		} else {
			if _, err := os.Stat(filepath.Join(res[0].Mountpoint, "data")); err != nil {
				return fmt.Errorf("restore %d did not bring the data back: %w", i, err)
			}
			samples, procs = append(samples, took), procs+ran
		}
		if err := mgr.Wait(ctx); err != nil {
			return err
		}
		t.End(ten)
		if err := mgr.ReleaseEnded(ctx); err != nil {
			return fmt.Errorf("release %d: %w", i, err)
		}
		if err := mgr.Wait(ctx); err != nil {
			return err
		}
	}
	r.RestoreP50 = Percentile(samples, 50)
	r.RestoreProcs = float64(procs) / float64(len(samples))
	logf("restore p50 %s, %.1f zfs processes", r.RestoreP50, r.RestoreProcs)

	// The floor: the same archive renamed to a slot's name and mounted,
	// then put back (untimed).
	_, archives, _, err := retention.Read(ctx, client, cfg.ArchiveDataset())
	if err != nil || len(archives) == 0 {
		return fmt.Errorf("no archive for the floor: %v", err)
	}
	arch, spot := archives[0].Name, cfg.ClassDataset("state")+"/floor"
	// A release leaves the archive canmount=off on zfs-fuse (its
	// unmount); the floor mounts it as it is: made mountable once,
	// untimed (the plugin's restore sets canmount with its marks).
	if _, err := runner.ZFSCmd(ctx, "set", "canmount=noauto", arch); err != nil {
		return err
	}
	var floors []time.Duration
	for i := 0; i < o.Reps; i++ {
		start := time.Now()
		if _, err := runner.ZFSCmd(ctx, "rename", arch, spot); err != nil {
			return err
		}
		if _, err := runner.ZFSCmd(ctx, "mount", spot); err != nil {
			return err
		}
		floors = append(floors, time.Since(start))
		if _, err := runner.ZFSCmd(ctx, "unmount", spot); err != nil {
			return err
		}
		if _, err := runner.ZFSCmd(ctx, "rename", spot, arch); err != nil {
			return err
		}
	}
	r.RestoreFloorP50 = Percentile(floors, 50)
	r.RestoreRatio = durRatio(r.RestoreP50, r.RestoreFloorP50)
	logf("restore floor p50 %s: ratio %.2f", r.RestoreFloorP50, r.RestoreRatio)
	return nil
}

func (r *MobilityResult) move(ctx context.Context, o MobilityOptions, logf func(string, ...any)) error {
	a, doneA, err := mobilityPool(ctx, o.WorkDir, "node-a")
	if err != nil {
		return err
	}
	defer doneA()
	b, doneB, err := mobilityPool(ctx, o.WorkDir, "node-b")
	if err != nil {
		return err
	}
	defer doneB()
	dir := filepath.Join(o.WorkDir, "backups")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cfgA, cfgB := slots.Config{Parent: a.Dataset("nomad")}, slots.Config{Parent: b.Dataset("nomad")}
	for _, c := range []struct {
		p   *sandbox.Pool
		cfg slots.Config
	}{{a, cfgA}, {b, cfgB}} {
		if _, err := c.p.Runner.ZFSCmd(ctx, "create", "-o", record.PropManaged+"="+record.ManagedArchive, "-o", "canmount=noauto", c.cfg.ArchiveDataset()); err != nil {
			return err
		}
	}
	ka := backup.NewKeeper(zfs.NewClient(a.Runner), hclog.NewNullLogger())
	kb := backup.NewKeeper(zfs.NewClient(b.Runner), hclog.NewNullLogger())
	classes := map[string]bool{"state": true}
	ka.SetConfig(backup.Config{Dir: dir, Container: cfgA.ArchiveDataset(), Classes: classes})
	kb.SetConfig(backup.Config{Dir: dir, Container: cfgB.ArchiveDataset(), Classes: classes})

	var plugin, floor []time.Duration
	for i := 0; i < o.Reps; i++ {
		owner := record.Owner{AllocID: fmt.Sprintf("%08x-0000-4000-8000-000000000000", i+1), Namespace: "default",
			Job: fmt.Sprintf("move%d", i), Group: "g", Task: "t", AllocName: fmt.Sprintf("move%d.g[0]", i)}
		name := record.ArchivedName(cfgA.ArchiveDataset(), "state", 0, owner, time.Now())
		if _, err := a.Runner.ZFSCmd(ctx, "create", name); err != nil {
			return err
		}
		mnt := filepath.Join(a.Mountpoint, strings.TrimPrefix(name, a.Name+"/"))
		if err := writeRandom(filepath.Join(mnt, "data"), o.DataMiB); err != nil {
			return err
		}
		for _, args := range [][]string{{"unmount", name}, {"set", "canmount=noauto", name},
			{"set", record.PropManaged + "=" + record.ManagedSlot, name}, {"set", record.PropState + "=archived", name},
			{"set", record.PropOwner + "=" + owner.Encode(), name}} {
			if _, err := a.Runner.ZFSCmd(ctx, args...); err != nil {
				return err
			}
		}
		// The plugin: the keeper's pass on node a, Fetch on node b.
		start := time.Now()
		sent, _, err := ka.Pass(ctx)
		if err != nil || len(sent) != 1 {
			return fmt.Errorf("send %d: %d sent, %v", i, len(sent), err)
		}
		got, err := kb.Fetch(ctx, "state", owner, retention.Archive{})
		if err != nil || got == "" {
			return fmt.Errorf("fetch %d: %q, %v", i, got, err)
		}
		plugin = append(plugin, time.Since(start))
		// The floor: the same snapshot, piped from pool a to pool b.
		snap := sent[0].Dataset + "@" + sent[0].Snapshot
		start = time.Now()
		if err := pipe(ctx, snap, b.Dataset(fmt.Sprintf("floor%d", i))); err != nil {
			return err
		}
		floor = append(floor, time.Since(start))
	}
	r.MoveP50, r.MoveFloorP50 = Percentile(plugin, 50), Percentile(floor, 50)
	r.MoveRatio = durRatio(r.MoveP50, r.MoveFloorP50)
	r.MoveMiBps = float64(o.DataMiB) / r.MoveP50.Seconds()
	r.FloorMiBps = float64(o.DataMiB) / r.MoveFloorP50.Seconds()
	logf("move p50 %s (%.1f MiB/s) against zfs send | zfs receive %s (%.1f MiB/s): ratio %.2f",
		r.MoveP50, r.MoveMiBps, r.MoveFloorP50, r.FloorMiBps, r.MoveRatio)
	return nil
}

// pipe is the floor of a move: `zfs send -p snap | zfs receive -u target`,
// two processes joined by a pipe, as an operator would type it.
func pipe(ctx context.Context, snap, target string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	send := exec.CommandContext(ctx, "zfs", "send", "-p", snap)
	recv := exec.CommandContext(ctx, "zfs", "receive", "-u", target)
	out, err := send.StdoutPipe()
	if err != nil {
		return err
	}
	recv.Stdin = out
	var serr, rerr strings.Builder
	send.Stderr, recv.Stderr = &serr, &rerr
	if err := recv.Start(); err != nil {
		return err
	}
	if err := send.Run(); err != nil {
		_ = recv.Wait()
		return fmt.Errorf("zfs send %s: %w: %s", snap, err, serr.String())
	}
	if err := recv.Wait(); err != nil {
		return fmt.Errorf("zfs receive %s: %w: %s", target, err, rerr.String())
	}
	return nil
}

func writeRandom(path string, mib int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := 0; i < mib; i++ {
		if _, err := rand.Read(buf); err != nil {
			f.Close()
			return err
		}
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(f.Sync(), f.Close())
}

func durRatio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// WriteMobility prints the mobility figures as a Markdown table.
func WriteMobility(w io.Writer, r *MobilityResult) {
	fmt.Fprintf(w, "| data follows the job (%d MiB, %d reps) | plugin p50 | raw ZFS p50 | ratio |\n|---|---|---|---|\n", r.DataMiB, r.Reps)
	fmt.Fprintf(w, "| restore on the same node (Reserve; %.1f zfs processes) | %s | %s (rename + mount) | %.2f |\n",
		r.RestoreProcs, r.RestoreP50.Round(time.Millisecond), r.RestoreFloorP50.Round(time.Millisecond), r.RestoreRatio)
	fmt.Fprintf(w, "| to another node through backup_dir (%.1f MiB/s) | %s | %s (send \\| receive, %.1f MiB/s) | %.2f |\n",
		r.MoveMiBps, r.MoveP50.Round(time.Millisecond), r.MoveFloorP50.Round(time.Millisecond), r.FloorMiBps, r.MoveRatio)
}
