// Package churn is the churn scenario of `make bench` (`zfsbench -churn`):
// many short jobs through a few slots on a real Nomad agent, against the
// same jobs without a device (the baseline), against a device plugin
// that does nothing (the null device, the control), and against the same
// with each job's dataset made and destroyed and nothing else (the floor
// control, floor.go). See bench/README.md.
//
// It starts its agent with the tests' starter, internal/nomadtest (Start,
// outside a test), and so links test support, unlike package bench.
package churn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/bench/churn/floor"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
)

// The churn scenario (issue 10): a real Nomad agent, the exec driver, the
// plugin with one class of a few slots, and many short batch jobs that each
// use one slot, against the same jobs without a device (the baseline) at
// the same concurrency, in the same run. The agent's CPU budget
// (cpu_total_compute) admits exactly as many tasks at once as there are
// slots, so both kinds of batch run equally many jobs at a time.

// agentStopTimeout is how long the agent's Stop waits after SIGINT
// before SIGKILL.
const agentStopTimeout = 30 * time.Second

const (
	churnClass      = "scratch"
	churnTaskCPU    = 1000 // MHz per task; the node has Slots × this
	churnPollPeriod = 100 * time.Millisecond
	batchTimeout    = 4 * time.Minute
	settleTimeout   = 60 * time.Second
)

// Options configure Run.
type Options struct {
	Jobs      int    // jobs per batch (40)
	Slots     int    // slots of the class, and tasks at once (4)
	Pairs     int    // baseline+device batch pairs, alternating (2)
	IdleJobs  int    // device jobs run one at a time first, for Reserve on an idle node (8)
	PluginBin string // the built plugin binary
	// NullBin is the control device plugin (bench/nulldevice), built from
	// ./bench/cmd/nulldevice. When set, the plugin's batches are followed
	// by the control: the same idle jobs and batches against a device
	// plugin that does nothing (null.go, the null rows), then by the floor
	// control's batches (floor.go, the floor rows).
	NullBin  string
	NomadBin string // the Nomad agent binary (NomadBinary when empty)
	WorkDir  string // agent directory, counting wrappers
	// KeepLog, when set, is where the agent log is copied once the agent
	// has stopped (WorkDir is usually removed). A batch that does not end,
	// or whose slots do not settle, writes its stall report beside it
	// (stallPath).
	KeepLog  string
	Progress io.Writer
}

// Results is what Run measured; cmd/zfsbench writes it as
// bench/churn-results.json.
type Results struct {
	Machine bench.Machine `json:"machine"`
	Started time.Time     `json:"started"`
	Seconds float64       `json:"seconds"`
	Jobs    int           `json:"jobs_per_batch"`
	Slots   int           `json:"slots"`
	NodeCPU int           `json:"node_cpu_mhz"`
	Idle    []AllocRecord `json:"idle_jobs"`
	Batches []BatchResult `json:"batches"`
	// IdleNull and Null are the idle jobs and the batches run against
	// the null device plugin (Options.NullBin) after the plugin's;
	// the rows of the plugin's own figures never read them.
	IdleNull []AllocRecord `json:"idle_null_jobs,omitempty"`
	Null     []BatchResult `json:"null_batches,omitempty"`
	// Floor are the floor control's batches (floor.go), run after the
	// null device's: its jobs, each given a dataset of its own.
	Floor     []BatchResult             `json:"floor_batches,omitempty"`
	Releases  []ReleaseRecord           `json:"releases"`
	Rows      []Row                     `json:"rows"`
	Health    map[string][]healthChange `json:"health_transitions"`
	Fingerprs int                       `json:"fingerprints_sent"`
	RSSStart  uint64                    `json:"plugin_rss_start_bytes"`
	RSSEnd    uint64                    `json:"plugin_rss_end_bytes"`
	HWMEnd    uint64                    `json:"plugin_peak_rss_end_bytes"`
	Warnings  []string                  `json:"plugin_warnings,omitempty"`
	Notes     []string                  `json:"notes,omitempty"`
	AgentLog  string                    `json:"agent_log"`

	// reads are the plugin's non-blocking allocation reads during the
	// device batches (for the notes; not written). Every read, blocking
	// or not, is counted per batch (ListReads).
	reads []logRead
	// lockWaits are the waits of Reserves for their slot's lock during
	// the device batches.
	lockWaits []logLockWait
}

// allBatches returns the batches of every kind, in the order they ran:
// the plugin's (with the baseline's), the null device's, the floor's.
// The slices are the Results' own: a change to a batch through them is a
// change to it.
func (r *Results) allBatches() [][]BatchResult {
	return [][]BatchResult{r.Batches, r.Null, r.Floor}
}

// BatchResult is one batch of jobs.
type BatchResult struct {
	Kind          string    `json:"kind"` // baseline, device or null
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"` // the last allocation terminal
	Seconds       float64   `json:"seconds"`
	JobsPerSecond float64   `json:"jobs_per_second"`
	MaxConcurrent int       `json:"max_concurrent"`
	Failed        int       `json:"failed"`
	ZFSProcesses  int       `json:"zfs_processes"` // from Start until the slots settled
	// ZFSCounts are the same processes by command and subcommand.
	ZFSCounts     bench.Counts `json:"zfs_counts,omitempty"`
	WindowSeconds float64      `json:"window_seconds"`
	CPU           *CPUUse      `json:"cpu"` // over the same window
	// ListReads is how many times the plugin read the node's allocation
	// list (blocking or not) from Start until the slots settled, and
	// ListMost the most allocations one of those reads listed: each
	// allocation in it carries its job.
	ListReads int           `json:"plugin_list_reads"`
	ListMost  int           `json:"plugin_list_most_allocs"`
	Allocs    []AllocRecord `json:"allocs"`
}

// AllocRecord is one job's allocation.
type AllocRecord struct {
	Job        string    `json:"job"`
	AllocID    string    `json:"alloc_id"`
	Device     string    `json:"device,omitempty"`
	Status     string    `json:"status"`
	Started    time.Time `json:"started"`
	Finished   time.Time `json:"finished"`
	Terminated time.Time `json:"terminated_event"`
	Terminal   time.Time `json:"terminal"` // the alloc's modify time once terminal
	// Placed is the allocation's create time: when the scheduler placed it.
	Placed time.Time `json:"placed"`
	// ReserveMS is the client's "devices" prestart hook (Reserve over gRPC).
	ReserveMS float64 `json:"reserve_ms,omitempty"`
	// ReserveStart is when that hook began (zero without one).
	ReserveStart time.Time `json:"reserve_start,omitzero"`
	// Fresh is true when the slot had no release in progress as the hook
	// began.
	Fresh bool `json:"fresh"`
	// How the plugin handed the slot over, from its "slot reserved" line:
	// "fresh" (a free dataset), "spare" (the spare of a slot whose tenant
	// had ended), "owner" (made for it by a release it waited for, or its
	// own again); "" when no line was found.
	How string `json:"how,omitempty"`
	// ReserveZFSMS is the longest zfs set of the slot's state that the
	// plugin ran on the slot within the hook (the one of a fresh slot; the
	// longer of a spare's two side by side), from its runner's "ran" line.
	ReserveZFSMS float64 `json:"reserve_zfs_ms,omitempty"`
	// ReservePluginMS is the plugin's own part of the hook: from the
	// Reserve's arrival to its "slot reserved" line (its "took").
	ReservePluginMS float64 `json:"reserve_plugin_ms,omitempty"`
	// ZFSInFlight are the plugin's zfs and zpool commands, on any slot,
	// that were running at some moment of the hook (inflight.go): what
	// each was ("set canmount", "rename", ...), sorted.
	ZFSInFlight []string `json:"zfs_in_flight,omitempty"`
	// Prepared: the plugin reserved the slot for this allocation when it
	// saw it placed, and its Reserve handed it over as prepared.
	Prepared bool `json:"prepared,omitempty"`
	// PrepLeadMS is, for a prepared Reserve, how long before the hook
	// began the preparation's zfs work ended (negative: the Reserve waited
	// for it that long); PrepMS how long that work took.
	PrepLeadMS float64 `json:"prep_lead_ms,omitempty"`
	PrepMS     float64 `json:"prep_ms,omitempty"`
	// LogmonMS is the client's "logmon" prestart hook: the start of the
	// task's log collector, a process, device job or not (launch-storm).
	LogmonMS float64 `json:"logmon_ms,omitempty"`
}

// Run runs the scenario on a pool made for it and returns its
// figures. Every process it starts is stopped and the pool destroyed
// before it returns.
func Run(ctx context.Context, o Options) (res *Results, err error) {
	if o.Jobs <= 0 {
		o.Jobs = 40
	}
	if o.Slots <= 0 {
		o.Slots = 4
	}
	if o.Pairs <= 0 {
		o.Pairs = 2
	}
	if o.IdleJobs <= 0 {
		// Eight: the reference of both Reserve rows is their p50, which
		// three samples left at the mercy of one slow one.
		o.IdleJobs = 8
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "[churn] %s\n", fmt.Sprintf(format, args...))
	}
	if o.NomadBin == "" {
		if o.NomadBin, err = NomadBinary(); err != nil {
			return nil, err
		}
	}
	out := &Results{Machine: bench.ThisMachine(), Started: time.Now(), Jobs: o.Jobs, Slots: o.Slots}
	res = out
	defer func() { out.Seconds = time.Since(out.Started).Seconds() }() // res may be nil on an early return

	pool, parent, destroy, err := bench.NewParent(ctx, 1<<30)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := destroy(); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	dir := filepath.Join(o.WorkDir, "churn")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return nil, err
	}
	counter, err := bench.NewCounter(filepath.Join(dir, "bin"))
	if err != nil {
		return nil, err
	}
	chroot, err := localagent.ChrootEnv(ctx, []string{"/bin/sh", "/bin/sleep"}, nil)
	if err != nil {
		return nil, err
	}
	pluginCfg := fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "5s"
    class %q {
      slots = %d
      quota = "32M"
    }
  }
}`, parent, churnClass, o.Slots)
	if o.NullBin != "" {
		pluginCfg += nullConfig(filepath.Join(dir, "null"), o.Slots)
	}
	pluginDir, err := plugins(dir, o)
	if err != nil {
		return nil, err
	}
	logf("starting nomad agent (%s), pool %s", o.NomadBin, pool.Name)
	a, err := nomadtest.Start(ctx, o.NomadBin, nomadtest.Options{
		Dir: dir, PluginDir: pluginDir, LogLevel: "TRACE", StopTimeout: agentStopTimeout,
		ClientConfig: fmt.Sprintf("cpu_total_compute = %d", o.Slots*churnTaskCPU), Chroot: chroot,
		PluginConfig: pluginCfg, PathFirst: filepath.Join(dir, "bin"),
	})
	if err != nil {
		return nil, err
	}
	res.AgentLog = a.LogPath
	defer func() {
		if serr := a.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		if o.KeepLog != "" {
			if cerr := copyFile(a.LogPath, o.KeepLog, 0o644); cerr == nil {
				res.AgentLog = o.KeepLog
			}
		}
	}()
	wctx, stopWatch := context.WithCancel(ctx)
	watch, watched := watchNode(wctx, a.API, a.NodeID, "zfs", "dataset", churnClass, churnPollPeriod)
	defer func() { stopWatch(); watched() }()

	r := &churnRun{o: o, a: a, watch: watch, counter: counter, parent: parent, pool: pool.Name, dir: dir, res: res, logf: logf}
	if err := r.run(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// churnRun is one run of the scenario.
type churnRun struct {
	o       Options
	a       *nomadtest.Agent
	watch   *nodeWatch
	counter *bench.Counter
	parent  string
	pool    string // the pool's name
	dir     string // the run's directory
	res     *Results
	logf    func(string, ...any)
	seq     int
	plugin  int // the plugin's PID, for its CPU time
	// floor is the floor driver while the floor batches run (floor.go).
	floor *floor.Driver
}

func (r *churnRun) run(ctx context.Context) error {
	node, _, err := r.a.API.Nodes().Info(r.a.NodeID, nil)
	if err != nil {
		return err
	}
	if node.NodeResources != nil {
		r.res.NodeCPU = int(node.NodeResources.Cpu.CpuShares)
	}
	if want := r.o.Slots * churnTaskCPU; r.res.NodeCPU != want {
		return fmt.Errorf("the node offers %d MHz of CPU, not the %d of cpu_total_compute: concurrency would not be %d", r.res.NodeCPU, want, r.o.Slots)
	}
	if err := r.settle(ctx, nil); err != nil {
		return fmt.Errorf("waiting for %d healthy slots: %w", r.o.Slots, err)
	}
	pid, err := pluginPID(r.a)
	if err != nil {
		return err
	}
	if r.res.RSSStart, err = procStatusBytes(pid, "VmRSS"); err != nil {
		return err
	}
	r.plugin = pid
	r.logf("agent up at %s, node %s (%d MHz), plugin pid %d, RSS %.1f MiB", r.a.Addr, r.a.NodeID, r.res.NodeCPU, pid, mib(r.res.RSSStart))

	for i := range r.o.IdleJobs {
		b, err := r.batch(ctx, "idle", 1, kindDevice)
		if err != nil {
			return fmt.Errorf("idle device job %d: %w", i+1, err)
		}
		r.res.Idle = append(r.res.Idle, b.Allocs...)
	}
	for p := range r.o.Pairs {
		for _, kind := range []string{kindBaseline, kindDevice} {
			if err := r.emptyNode(ctx, fmt.Sprintf("%s batch %d", kind, p+1)); err != nil {
				return err
			}
			r.logf("pair %d: %s batch of %d jobs", p+1, kind, r.o.Jobs)
			b, err := r.batch(ctx, kind, r.o.Jobs, kind)
			if err != nil {
				return fmt.Errorf("%s batch %d: %w", kind, p+1, err)
			}
			r.logBatch(p, b)
			r.res.Batches = append(r.res.Batches, *b)
		}
	}
	if r.o.NullBin != "" {
		if err := r.control(ctx); err != nil {
			return err
		}
		if err := r.floorControl(ctx); err != nil {
			return err
		}
	}
	if pid2, err := pluginPID(r.a); err != nil || pid2 != pid {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("plugin process changed during the run (pid %d, now %d, %v)", pid, pid2, err))
		pid = pid2
	}
	if r.res.RSSEnd, err = procStatusBytes(pid, "VmRSS"); err != nil {
		return err
	}
	r.res.HWMEnd, _ = procStatusBytes(pid, "VmHWM")
	return r.figures()
}

// logBatch prints one line of figures of batch b (of pair p+1, or of the
// control).
func (r *churnRun) logBatch(p int, b *BatchResult) {
	where := fmt.Sprintf("pair %d", p+1)
	switch b.Kind {
	case kindNull:
		where = fmt.Sprintf("control %d", p+1)
	case kindFloor:
		where = fmt.Sprintf("floor %d", p+1)
	}
	r.logf("%s: %s: %.1f s, %.2f jobs/s, at most %d at once, %d zfs processes, %.2f CPU-s per job", where, b.Kind, b.Seconds, b.JobsPerSecond, b.MaxConcurrent, b.ZFSProcesses, b.CPU.Machine/float64(len(b.Allocs)))
}

// batch registers n jobs of kind job (kindBaseline, kindDevice, kindNull)
// at once, named and recorded as label, and returns once every allocation
// is terminal and the slots are all fresh and healthy again.
func (r *churnRun) batch(ctx context.Context, label string, n int, job string) (*BatchResult, error) {
	r.seq++
	prefix := fmt.Sprintf("churn-%02d-%s-", r.seq, label)
	mark, err := r.counter.Mark()
	if err != nil {
		return nil, err
	}
	jobs := make([]string, 0, n)
	for i := range n {
		jobs = append(jobs, fmt.Sprintf("%s%02d", prefix, i))
	}
	cpu0, err := sampleCPU(r.plugin, r.a.PID)
	if err != nil {
		return nil, err
	}
	b := &BatchResult{Kind: label, Start: time.Now()}
	for i := range n {
		if _, _, err := r.a.API.Jobs().Register(churnJob(jobs[i], job), nil); err != nil {
			return nil, fmt.Errorf("registering: %w", err)
		}
	}
	stubs, err := r.waitTerminal(ctx, prefix, n)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err // stopped, not stalled
		}
		return nil, r.stalled(prefix, err)
	}
	for _, s := range stubs {
		a, _, err := r.a.API.Allocations().Info(s.ID, nil)
		if err != nil {
			return nil, err
		}
		rec := allocRecord(a)
		if rec.Status != api.AllocClientStatusComplete {
			b.Failed++
		}
		if rec.Terminal.After(b.End) {
			b.End = rec.Terminal
		}
		b.Allocs = append(b.Allocs, rec)
	}
	sort.Slice(b.Allocs, func(i, j int) bool { return b.Allocs[i].Job < b.Allocs[j].Job })
	b.Seconds = b.End.Sub(b.Start).Seconds()
	b.JobsPerSecond = float64(n) / b.Seconds
	b.MaxConcurrent = maxConcurrent(b.Allocs)
	var released []string
	if job == kindDevice {
		released = jobs
	}
	settleErr := r.settle(ctx, released)
	if job == kindFloor && r.floor != nil && settleErr == nil {
		ids := make([]string, 0, len(b.Allocs))
		for _, a := range b.Allocs {
			ids = append(ids, a.AllocID)
		}
		settleErr = r.floor.Settled(ctx, ids)
	}
	c, err := r.counter.Since(mark)
	if err != nil {
		return nil, err
	}
	b.ZFSProcesses, b.ZFSCounts = c.Total(), c
	b.WindowSeconds = time.Since(b.Start).Seconds()
	cpu1, err := sampleCPU(r.plugin, r.a.PID)
	if err != nil {
		return nil, err
	}
	b.CPU = cpu1.since(cpu0)
	if settleErr != nil { // reported after the figures are taken
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("%s batch %s: %v", label, prefix, r.unsettled(prefix, settleErr)))
	}
	if b.Failed > 0 {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("%s batch %s: %d of %d allocations did not complete", label, prefix, b.Failed, n))
	}
	return b, nil
}

// waitTerminal polls until n allocations of jobs named prefix* are
// terminal on the client. Each poll asks the agent only for the batch's
// allocations, without their task states: the harness loads the machine
// it measures as little as it can (the whole list with every task's
// events, at the last batch some 170 allocations four times a second, was
// the agent's to encode).
func (r *churnRun) waitTerminal(ctx context.Context, prefix string, n int) ([]*api.AllocationListStub, error) {
	deadline := time.Now().Add(batchTimeout)
	q := &api.QueryOptions{Filter: fmt.Sprintf("JobID matches %q", "^"+regexp.QuoteMeta(prefix)), Params: map[string]string{"task_states": "false"}}
	for {
		all, _, err := r.a.API.Allocations().List(q)
		if err == nil {
			var mine []*api.AllocationListStub
			done := 0
			for _, s := range all {
				if strings.HasPrefix(s.JobID, prefix) {
					mine = append(mine, s)
					if s.ClientStatus == api.AllocClientStatusComplete || s.ClientStatus == api.AllocClientStatusFailed || s.ClientStatus == api.AllocClientStatusLost {
						done++
					}
				}
			}
			if done >= n {
				return mine, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%d of %d allocations terminal after %s", done, n, batchTimeout)
			}
		} else if time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// settle returns once the agent log shows a release of every job in
// released, every release there has its fresh dataset, and the node API
// shows every slot healthy.
func (r *churnRun) settle(ctx context.Context, released []string) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		lg, err := r.readLog()
		if err != nil {
			return err
		}
		open := openReleases(lg, time.Now())
		seen := map[string]bool{}
		for _, rel := range lg.Releases {
			seen[rel.Job] = true
		}
		var missing []string
		for _, j := range released {
			if !seen[j] {
				missing = append(missing, j)
			}
		}
		healthy, total, _ := r.watch.healthyCount()
		if len(open) == 0 && len(missing) == 0 && total == r.o.Slots && healthy == total {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slots not settled after %s: %d of %d healthy, releases open on %v, no release logged for %v", settleTimeout, healthy, total, open, missing)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (r *churnRun) readLog() (*churnLog, error) {
	f, err := os.Open(r.a.LogPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readChurnLog(f, r.parent, churnClass)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
