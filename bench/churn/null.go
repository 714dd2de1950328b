package churn

// The null device: the churn's control for the Reserve rows. Issue 10
// judges a Reserve during the churn against the same Reserve on an idle
// node. How much of that ratio is any device plugin's, whatever it does,
// is measured by running the same idle jobs and batches against a device
// plugin that does nothing (bench/nulldevice), loaded beside the plugin
// in the same agent: at the same moments of a batch (its first wave,
// started together, and the tasks after it), the null plugin's Reserve is
// the least any plugin's can be.
//
// The control runs after the plugin's batches, so that those run exactly
// as they do without it. Every batch, the plugin's, the baseline's, the
// control's and the floor's, starts on a node emptied by a forced garbage
// collection (emptyNode): the node's allocation list, which the plugin
// reads at every change, then holds the same history at the same point of
// each batch, and no kind of batch pays for the ones before it.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/bench/nulldevice"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
)

// gcTimeout bounds the wait for the forced garbage collection before a
// batch.
const gcTimeout = time.Minute

// control runs the null device's idle jobs and batches, as many as the
// plugin's, each series after a forced garbage collection.
func (r *churnRun) control(ctx context.Context) error {
	if err := r.emptyNode(ctx, "control"); err != nil {
		return err
	}
	r.logf("control: %d idle jobs and %d batches of %d jobs against the null device", r.o.IdleJobs, r.o.Pairs, r.o.Jobs)
	for i := range r.o.IdleJobs {
		b, err := r.batch(ctx, "idle-null", 1, kindNull)
		if err != nil {
			return fmt.Errorf("idle null device job %d: %w", i+1, err)
		}
		r.res.IdleNull = append(r.res.IdleNull, b.Allocs...)
	}
	for p := range r.o.Pairs {
		if err := r.emptyNode(ctx, fmt.Sprintf("null batch %d", p+1)); err != nil {
			return err
		}
		b, err := r.batch(ctx, kindNull, r.o.Jobs, kindNull)
		if err != nil {
			return fmt.Errorf("null batch %d: %w", p+1, err)
		}
		r.logBatch(p, b)
		r.res.Null = append(r.res.Null, *b)
	}
	return nil
}

// emptyNode has the node's terminal allocations collected before the
// batch what (collect); a node not empty after gcTimeout is noted in the
// results, and the run goes on. It fails only when ctx ends.
func (r *churnRun) emptyNode(ctx context.Context, what string) error {
	err := r.collect(ctx)
	if err == nil || ctx.Err() != nil {
		return err
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("%s: after the forced garbage collection: %v", what, err))
	return nil
}

// collect asks the servers for a forced garbage collection and returns
// once the node lists no allocation (nothing runs between batches) and
// the client has torn down every one it held (its allocation directory,
// <data dir>/alloc, is empty: the client destroys a collected allocation
// a moment after the servers' list no longer shows it, up to a second
// later under this load, which would otherwise fall in the next batch's
// window), or gcTimeout has passed: then with what was left.
func (r *churnRun) collect(ctx context.Context) error {
	if err := r.a.API.System().GarbageCollect(); err != nil {
		return fmt.Errorf("forced garbage collection: %w", err)
	}
	allocDir := filepath.Join(r.a.Dir, "data", "alloc")
	deadline := time.Now().Add(gcTimeout)
	for {
		var left error
		allocs, _, err := r.a.API.Nodes().Allocations(r.a.NodeID, nil)
		switch {
		case err != nil:
			left = fmt.Errorf("listing the node's allocations: %w", err)
		case len(allocs) > 0:
			left = fmt.Errorf("the node still lists %d allocations", len(allocs))
		default:
			switch dirs, err := os.ReadDir(allocDir); {
			case err != nil && !os.IsNotExist(err):
				left = fmt.Errorf("reading the client's allocation directory: %w", err)
			case len(dirs) > 0:
				left = fmt.Errorf("the client still holds %d allocation directories in %s", len(dirs), allocDir)
			}
		}
		if left == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s", left, gcTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nullName is the null plugin's device name; nullDevice what its jobs ask.
const (
	nullName   = "null"
	nullDevice = nulldevice.Vendor + "/" + nulldevice.DeviceType + "/" + nullName
)

// nullConfig is the agent's block for the null plugin: as many devices as
// slots, bound where a slot of the churn's class is, under the same
// variable, so that the device jobs run unchanged against it.
func nullConfig(hostDir string, instances int) string {
	return fmt.Sprintf("\nplugin %q {\n%s}\n", nulldevice.PluginName, nullConfigBlock(hostDir, instances))
}

// nullConfigBlock is nullConfig's config block.
func nullConfigBlock(hostDir string, instances int) string {
	return fmt.Sprintf(`  config {
    name       = %q
    instances  = %d
    host_dir   = %q
    mount_path = "/zfs/%s"
    path_env   = "ZFS_%s_PATH"
  }
`, nullName, instances, hostDir, churnClass, device.EnvName(churnClass))
}

// nullRows are the null device's rows: its Reserve in its batches' first
// waves and after them, each against its own idle Reserve, beside the
// plugin's at the same moments; and its throughput. None when the run had
// no null batches.
func nullRows(res *Results) []Row {
	idle := reserves(res.IdleNull)
	wave, rest := waveSplit(res.Null, res.Slots, reserveMS)
	if len(idle) == 0 || len(wave) == 0 || len(rest) == 0 {
		return nil
	}
	zfsIdle := bench.Median(reserves(res.Idle))
	zfsWave, zfsRest := waveSplit(res.Batches, res.Slots, reserveMS)
	fresh, _ := waveSplit(res.Batches, res.Slots, reserveIf(func(a AllocRecord) bool { return a.Fresh }))
	_, spare := waveSplit(res.Batches, res.Slots, reserveIf(func(a AllocRecord) bool { return a.How == "spare" }))
	q := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	base := bench.Median(idle)
	var rows []Row
	rows = append(rows, Row{Key: "null-reserve-wave",
		Figure:   fmt.Sprintf("control: Reserve of a device plugin that does nothing, p50, the first %d tasks of each of its batches (started together)", res.Slots),
		Measured: fmtMS(bench.Median(wave)), Reference: fmtMS(base) + " idle", Ratio: fmt.Sprintf("%.2f×", q(bench.Median(wave), base)), Value: q(bench.Median(wave), base),
		Target: "—", Verdict: "info",
		Note: fmt.Sprintf("bench/nulldevice: the same idle jobs and batches asking for its device, run after the plugin's on the same agent, each batch on a node emptied by a forced garbage collection, as every batch is; its Reserve answers at once (gRPC, the client's device manager and hook, nothing else). The fresh Reserve row's samples are the device batches' first waves: a plugin that took no time at all would read about %.2f× there (%d and %d samples). At the same moment the plugin's Reserves took p50 %s (all of its first waves, %d; its fresh ones %s, %d), %.2f× the null's; idle, the plugin's %s is %.2f× the null's",
			q(bench.Median(wave), base), len(wave), len(idle), fmtMS(bench.Median(zfsWave)), len(zfsWave), fmtMS(bench.Median(fresh)), len(fresh),
			q(bench.Median(zfsWave), bench.Median(wave)), fmtMS(zfsIdle), q(zfsIdle, base))})
	rows = append(rows, Row{Key: "null-reserve-rest",
		Figure:   "control: the same, the tasks after the first wave (one at a time as earlier ones end)",
		Measured: fmtMS(bench.Median(rest)), Reference: fmtMS(base) + " idle", Ratio: fmt.Sprintf("%.2f×", q(bench.Median(rest), base)), Value: q(bench.Median(rest), base),
		Target: "—", Verdict: "info",
		Note: fmt.Sprintf("the spare Reserve row's samples are the device batches' later Reserves: a plugin that took no time would read about %.2f× there (%d samples). The plugin's later Reserves took p50 %s (%d; its spare ones %s, %d), %.2f× the null's",
			q(bench.Median(rest), base), len(rest), fmtMS(bench.Median(zfsRest)), len(zfsRest), fmtMS(bench.Median(spare)), len(spare), q(bench.Median(zfsRest), bench.Median(rest)))})
	b, okBase := jobsPerSecond(res.Batches, kindBaseline)
	n, okNull := jobsPerSecond(res.Null, kindNull)
	if okBase && okNull {
		rows = append(rows, Row{Key: "null-throughput", Figure: "control: throughput, null device jobs / baseline jobs",
			Measured: fmt.Sprintf("%.2f jobs/s", n), Reference: fmt.Sprintf("%.2f jobs/s", b), Ratio: fmt.Sprintf("%.2f", n/b), Value: n / b,
			Target: "—", Verdict: "info",
			Note: "what asking for a device costs a job in Nomad itself (the devices hook, the bind mount into the task) when the plugin does nothing"})
	}
	return rows
}
