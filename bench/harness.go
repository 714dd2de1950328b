package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadproto/devicepb"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/pluginhost"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/sandbox"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// MountLimit is how many ZFS file systems the harness lets the machine have
// mounted at once: zfs-fuse fails the mount after about 999, and then keeps
// the pool busy until the daemon restarts, so a size that would not fit is
// skipped rather than run.
const MountLimit = 990

// Options configure Run.
type Options struct {
	Sizes []int // slot counts, one pool each
	// Reps is the number of interleaved plugin/floor pairs per timed measure
	// (the median is reported).
	Reps int
	// Creates is the number of create+mount floor samples per size.
	Creates int
	// PluginBin is the built plugin binary, launched as Nomad launches it for
	// the memory measure.
	PluginBin string
	// WorkDir holds the counting wrappers and their logs.
	WorkDir string
	// Progress receives one line per step; nil means none.
	Progress io.Writer
}

// Results is what Run measured; cmd/zfsbench writes it as bench/results.json.
type Results struct {
	Machine Machine      `json:"machine"`
	Started time.Time    `json:"started"`
	Seconds float64      `json:"seconds"`
	Reps    int          `json:"reps"`
	Sizes   []SizeResult `json:"sizes"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs      int    `json:"cpus"`
	MemoryMiB uint64 `json:"memory_mib"`
	ZFS       string `json:"zfs"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Date      string `json:"date"`
}

// SizeResult holds the rows measured with one number of slots.
type SizeResult struct {
	Slots   int    `json:"slots"`
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
	// Cleanup is why the size's pool could not be destroyed afterwards
	// (it is left, and named): the figures stand, and the run goes on.
	Cleanup          string  `json:"cleanup,omitempty"`
	ProvisionSeconds float64 `json:"provision_seconds,omitempty"`
	Rows             []Row   `json:"rows,omitempty"`
}

// Row is one line of the table.
type Row struct {
	Key     string   `json:"key"`
	Measure string   `json:"measure"`
	Unit    string   `json:"unit"` // ms, processes, MiB
	Plugin  float64  `json:"plugin"`
	Floor   *float64 `json:"floor,omitempty"`
	// Ratio is plugin/floor: for the interleaved timed rows, the median of
	// the ratios of each pair, and RatioOfMedians the ratio of the medians.
	Ratio          *float64 `json:"ratio,omitempty"`
	RatioOfMedians *float64 `json:"ratio_of_medians,omitempty"`
	Target         string   `json:"target"`
	Verdict        string   `json:"verdict"` // pass, miss, info
	Note           string   `json:"note,omitempty"`
	// Samples, in Unit, in the order they were taken.
	PluginSamples []float64 `json:"plugin_samples,omitempty"`
	FloorSamples  []float64 `json:"floor_samples,omitempty"`

	// judge returns the verdict; largest is true at the largest size run.
	judge func(r Row, largest bool) string
}

// Run measures every size in turn, each on a fresh pool that it destroys
// afterwards. ZFS must be usable (see sandbox.StartFuse). An error is
// returned only when nothing could be measured; failures of one size are in
// its SizeResult.
func Run(ctx context.Context, o Options) (*Results, error) {
	if o.Reps <= 0 {
		o.Reps = 15
	}
	if o.Creates <= 0 {
		o.Creates = 30
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	res := &Results{Machine: ThisMachine(), Started: time.Now(), Reps: o.Reps}
	for _, n := range o.Sizes {
		if ctx.Err() != nil {
			break
		}
		h := &sizeRun{o: o, n: n, log: o.Progress}
		res.Sizes = append(res.Sizes, h.run(ctx))
	}
	res.Seconds = time.Since(res.Started).Seconds()
	largest := 0
	for _, s := range res.Sizes {
		if s.Skipped == "" && s.Error == "" && s.Slots > largest {
			largest = s.Slots
		}
	}
	for i := range res.Sizes {
		s := &res.Sizes[i]
		for j := range s.Rows {
			r := &s.Rows[j]
			r.Verdict = "info"
			if r.judge != nil {
				r.Verdict = r.judge(*r, s.Slots == largest)
			}
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// sizeRun measures one number of slots.
type sizeRun struct {
	o      Options
	n      int
	log    io.Writer
	pool   *sandbox.Pool
	parent string
	floor  *zfs.Runner // runs the floors: real zfs, no wrapper
	rows   []Row
}

func (h *sizeRun) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "[%4d slots] %s\n", h.n, fmt.Sprintf(format, args...))
}

func (h *sizeRun) run(ctx context.Context) (out SizeResult) {
	out.Slots = h.n
	mounted, err := ZFSMounts()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	need := h.n + 5 + h.o.Creates // pool root, parent, class, floor parent, floor release slot
	if mounted+need > MountLimit {
		out.Skipped = fmt.Sprintf("needs %d more mounted file systems; %d are mounted and zfs-fuse fails past about 999", need, mounted)
		h.logf("skipped: %s", out.Skipped)
		return out
	}
	size := int64(2 << 30)
	if h.n > 1000 {
		size = 4 << 30
	}
	var destroy func() error
	if h.pool, destroy, err = NewPool(ctx, size); err != nil {
		out.Error = err.Error()
		return out
	}
	defer func() {
		h.logf("destroying pool %s", h.pool.Name)
		if err := destroy(); err != nil {
			out.Cleanup = err.Error()
			h.logf("warning: %v", err)
		}
	}()
	h.parent = h.pool.Dataset("nomad")
	h.floor = &zfs.Runner{}
	for _, ds := range []string{h.parent, h.pool.Dataset("floor")} {
		if _, err := h.floor.ZFSCmd(ctx, "create", ds); err != nil {
			out.Error = err.Error()
			return out
		}
	}

	h.logf("provisioning on pool %s", h.pool.Name)
	start := time.Now()
	p, err := NewPlugin(&zfs.Runner{})
	if err != nil {
		out.Error = err.Error()
		return out
	}
	if err := Configure(ctx, p.Conn, h.config("1h", "1h")); err != nil {
		p.Close()
		out.Error = err.Error()
		return out
	}
	stop, err := FirstFingerprint(p.Conn, h.n, 30*time.Minute)
	if err != nil {
		p.Close()
		out.Error = "provisioning: " + err.Error()
		return out
	}
	stop()
	out.ProvisionSeconds = time.Since(start).Seconds()
	p.Close()
	h.logf("provisioned in %.1f s", out.ProvisionSeconds)

	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"start-up", h.startup},
		{"fingerprint and stats refresh", h.refreshes},
		{"process counts", h.counts},
		{"memory", h.memory},
		{"release", h.release},
		{"reserve", h.reserve},
	}
	for _, s := range steps {
		if ctx.Err() != nil {
			out.Error = ctx.Err().Error()
			break
		}
		h.logf("measuring %s", s.name)
		if err := s.f(ctx); err != nil {
			out.Error = strings.TrimPrefix(out.Error+"; ", "; ") + s.name + ": " + err.Error()
			h.logf("%s failed: %v", s.name, err)
		}
	}
	out.Rows = h.rows
	return out
}

func (h *sizeRun) config(fingerprintPeriod, statsPeriod string) string {
	return PluginConfig(h.parent, h.n, fingerprintPeriod, statsPeriod)
}

// floorGet times the floor of every periodic path.
func (h *sizeRun) floorGet(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := h.floor.ZFSCmd(ctx, FloorGetArgs(h.parent)...)
	return time.Since(start), err
}

// interleave runs reps pairs of plugin and floor, alternating which goes
// first, so that drift on a busy machine hits both alike.
func interleave(reps int, plugin, floor func() (time.Duration, error)) (ps, fs []time.Duration, err error) {
	for i := 0; i < reps; i++ {
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, isPlugin := range order {
			if isPlugin {
				d, err := plugin()
				if err != nil {
					return ps, fs, err
				}
				ps = append(ps, d)
			} else {
				d, err := floor()
				if err != nil {
					return ps, fs, err
				}
				fs = append(fs, d)
			}
		}
	}
	return ps, fs, nil
}

func (h *sizeRun) startup(ctx context.Context) error {
	if _, err := h.floorGet(ctx); err != nil { // warm-up
		return err
	}
	ps, fs, err := interleave(h.o.Reps, func() (time.Duration, error) {
		p, err := NewPlugin(&zfs.Runner{})
		if err != nil {
			return 0, err
		}
		defer p.Close()
		start := time.Now()
		if err := Configure(ctx, p.Conn, h.config("1h", "1h")); err != nil {
			return 0, err
		}
		stop, err := FirstFingerprint(p.Conn, h.n, 10*time.Minute)
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		stop()
		return d, nil
	}, func() (time.Duration, error) { return h.floorGet(ctx) })
	if err != nil {
		return err
	}
	h.addTimeRow("startup", "start-up: adopt existing slots (SetConfig → first fingerprint)", ps, fs, "", ratioAtLargest(1.2))
	return nil
}

func (h *sizeRun) refreshes(ctx context.Context) error {
	r := &zfs.Runner{}
	mgr := slots.NewManager(zfs.NewClient(r), hclog.NewNullLogger())
	mgr.SetConfig(SlotsConfig(h.parent, h.n))
	if err := mgr.Sync(ctx); err != nil {
		return err
	}
	healthy := 0
	for _, s := range mgr.Slots() {
		if s.Healthy {
			healthy++
		}
	}
	if healthy != h.n {
		return fmt.Errorf("manager sees %d healthy slots, want %d", healthy, h.n)
	}
	timed := func(want int64, f func(context.Context) error) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			before := r.Runs()
			start := time.Now()
			err := f(ctx)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			if got := r.Runs() - before; got != want {
				return 0, fmt.Errorf("ran %d zfs processes, want %d: not a refresh with nothing to change", got, want)
			}
			return d, nil
		}
	}
	floor := func() (time.Duration, error) { return h.floorGet(ctx) }
	ps, fs, err := interleave(h.o.Reps, timed(2, mgr.Sync), floor)
	if err != nil {
		return fmt.Errorf("fingerprint refresh: %w", err)
	}
	h.addTimeRow("fingerprint", "fingerprint refresh (Sync, nothing to change)", ps, fs, "", ratioAtLargest(1.2))
	ps, fs, err = interleave(h.o.Reps, timed(1, mgr.Refresh), floor)
	if err != nil {
		return fmt.Errorf("stats refresh: %w", err)
	}
	h.addTimeRow("stats", "stats refresh (Refresh)", ps, fs, "", ratioAtLargest(1.2))
	return nil
}

// newCounter returns a counter whose wrappers live in a new directory of
// the work directory, and a function that removes it.
func (h *sizeRun) newCounter() (*Counter, func(), error) {
	dir, err := os.MkdirTemp(h.o.WorkDir, "count-")
	if err != nil {
		return nil, nil, err
	}
	c, err := NewCounter(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return c, func() { _ = os.RemoveAll(dir) }, nil
}

// countRefreshes is how many of each refresh the counting pass runs.
const countRefreshes = 3

// counts counts processes through the wrappers: Sync and Refresh of a
// manager, start-up and Reserve of a plugin. It reserves the last
// reserveCount() slots.
func (h *sizeRun) counts(ctx context.Context) error {
	c, done, err := h.newCounter()
	if err != nil {
		return err
	}
	defer done()
	mgr := slots.NewManager(zfs.NewClient(c.Runner()), hclog.NewNullLogger())
	mgr.SetConfig(SlotsConfig(h.parent, h.n))
	var syncs, refreshes []Counts
	for i := 0; i < countRefreshes; i++ {
		got, err := c.Count(func() error { return mgr.Sync(ctx) })
		if err != nil {
			return err
		}
		syncs = append(syncs, got)
		if got, err = c.Count(func() error { return mgr.Refresh(ctx) }); err != nil {
			return err
		}
		refreshes = append(refreshes, got)
	}
	h.addCountRow("procs-stats", "zfs processes per stats refresh", refreshes, Counts{"zfs get -r": 1},
		"exactly 1 (zfs get -r), every refresh", exactly(Counts{"zfs get -r": 1}))
	h.addCountRow("procs-fingerprint", "zfs processes per fingerprint refresh", syncs, Counts{"zpool list": 1, "zfs get -r": 1},
		"exactly 2 (zpool list + zfs get -r), every refresh", exactly(Counts{"zpool list": 1, "zfs get -r": 1}))

	p, err := NewPlugin(c.Runner())
	if err != nil {
		return err
	}
	defer p.Close()
	startup, err := c.Count(func() error {
		if err := Configure(ctx, p.Conn, h.config("1h", "1h")); err != nil {
			return err
		}
		stop, err := FirstFingerprint(p.Conn, h.n, 10*time.Minute)
		if err == nil {
			stop()
		}
		return err
	})
	if err != nil {
		return err
	}
	h.addCountRow("procs-startup", "zfs processes at start-up", []Counts{startup}, Counts{"zfs get -r": 1}, "", nil)
	if err := p.Adopt(ctx); err != nil { // the earlier runs' armed datasets
		return err
	}

	var reserves []Counts
	for _, i := range h.countIndexes() {
		got, err := c.Count(func() error {
			if _, err := Reserve(ctx, p.Conn, DeviceID(i)); err != nil {
				return err
			}
			return p.Settle(ctx)
		})
		if err != nil {
			return err
		}
		reserves = append(reserves, got)
	}
	// Behind a Reserve, the plugin's release loop (run with a Nomad API,
	// which this bench has not) records the handover (one zfs set) and
	// then makes the slot's spare (one zfs create): the churn counts them.
	h.addCountRow("procs-reserve", "zfs processes per Reserve on a free slot: none (its dataset was made armed, internal/slots/armed.go)", reserves,
		Counts{}, "none, every call", exactly(Counts{}))
	return nil
}

// Slot indexes each step reserves: the counting pass takes the last ones,
// the memory child the one before them, the timed Reserve all the others.
func (h *sizeRun) countIndexes() []int {
	k := 3
	if h.n <= 10 {
		k = 1
	}
	var idx []int
	for i := h.n - k; i < h.n; i++ {
		idx = append(idx, i)
	}
	return idx
}

func (h *sizeRun) memoryIndex() int { return h.countIndexes()[0] - 1 }

func (h *sizeRun) timedIndexes() []int {
	var idx []int
	for i := 0; i < h.memoryIndex(); i++ {
		idx = append(idx, i)
	}
	return idx
}

// memory launches the plugin binary as a Nomad client does (go-plugin, gRPC),
// drives it through SetConfig, the fingerprint and stats streams and a
// Reserve for several refresh periods, and reads its peak RSS.
func (h *sizeRun) memory(ctx context.Context) error {
	floor, err := h.floorGet(ctx)
	if err != nil {
		return err
	}
	// The launched plugin has no Nomad to prove that nobody holds the
	// datasets an earlier run armed (adoption, internal/slots/armed.go):
	// the harness, which knows that no run ever handed this slot over,
	// records it free by hand, the state an earlier build wrote, standing
	// in for that proof.
	if _, err := h.floor.ZFSCmd(ctx, "set", record.PropState+"="+string(record.StateFree), SlotDataset(h.parent, h.memoryIndex())); err != nil {
		return err
	}
	plug, err := pluginhost.Launch(h.o.PluginBin, hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Error, Output: io.Discard}))
	if err != nil {
		return err
	}
	defer plug.Kill() // the plugin process, by the PID go-plugin started
	if err := Configure(ctx, plug.Conn, h.config("1s", "500ms")); err != nil {
		return err
	}
	stop, err := FirstFingerprint(plug.Conn, h.n, 10*time.Minute)
	if err != nil {
		return err
	}
	defer stop()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stats, err := plug.Device.Stats(sctx, &devicepb.StatsRequest{CollectionInterval: durationpb.New(100 * time.Millisecond)})
	if err != nil {
		return fmt.Errorf("opening the stats stream: %w", err)
	}
	if _, err := Reserve(ctx, plug.Conn, DeviceID(h.memoryIndex())); err != nil {
		return err
	}
	// Several fingerprint and stats refreshes, whatever one costs here:
	// the stream is read until run has passed, when the timer ends it.
	run := 6*time.Second + 4*floor
	over := time.AfterFunc(run, cancel)
	defer over.Stop()
	messages := 0
	for {
		_, err := stats.Recv()
		if err == nil {
			messages++
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if sctx.Err() != nil {
			break // run has passed
		}
		if errors.Is(err, io.EOF) {
			return errors.New("stats stream closed")
		}
		return fmt.Errorf("stats stream: %w", err)
	}
	peak, err := PeakRSS(plug.PID)
	if err != nil {
		return err
	}
	mib := float64(peak) / (1 << 20)
	h.rows = append(h.rows, Row{
		Key: "memory", Measure: "plugin memory (peak RSS of the plugin process)", Unit: "MiB",
		Plugin: round2(mib), Target: "< 64 MiB",
		Note: fmt.Sprintf("VmHWM of the plugin binary launched through go-plugin, after first fingerprint, %s of fingerprint (1s) and stats (500ms period, %d messages) refreshes and one Reserve", run.Round(time.Second), messages),
		judge: func(r Row, _ bool) string {
			return PassIf(r.Plugin < 64)
		},
	})
	return nil
}

// ThisMachine describes the machine the run is on: CPUs, memory, kernel,
// ZFS and Go.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339)}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				if f := strings.Fields(v); len(f) == 2 {
					kb, _ := strconv.ParseUint(f[0], 10, 64)
					m.MemoryMiB = kb >> 10
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.ZFS = zfsVersion()
	return m
}

func zfsVersion() string {
	if _, err := os.Stat("/dev/zfs"); err == nil {
		if b, err := os.ReadFile("/sys/module/zfs/version"); err == nil {
			return "OpenZFS " + strings.TrimSpace(string(b)) + " (kernel module)"
		}
		return "kernel module"
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "zfs-fuse").Output(); err == nil && len(out) > 0 {
		return "zfs-fuse " + string(out)
	}
	return "zfs-fuse"
}
