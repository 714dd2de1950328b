// Package periodic is the periodic scenario of `make bench` (`zfsbench
// -periodic`, issue 45): many short runs of a few periodic jobs on a real
// Nomad agent, through a class that archives each run's dataset and backs
// it up into backup_dir, and what that leaves behind once the plugin has
// settled: archives per parent job against keep, the bytes kept per job,
// and backup_dir against its retention; beside them, the keeper's send
// against a raw `zfs send | zfs receive` of the same snapshot, in the same
// run (bench.RunMove). See bench/README.md.
//
// It starts its agent with the tests' starter (nomadtest.Start, outside a
// test), as package churn does, and so links test support.
package periodic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/bench/churn"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

const (
	// class is the scenario's class: its slots' variable is
	// $ZFS_STATE_PATH.
	class = "state"
	// agentStopTimeout is how long the agent's Stop waits after SIGINT
	// before SIGKILL.
	agentStopTimeout = 30 * time.Second
	// devicesTimeout bounds the wait for the class's slots in the node.
	devicesTimeout = 2 * time.Minute
)

// Options configure Run. Zero fields take the defaults named.
type Options struct {
	Jobs    int // runs in all, across the parents (200)
	Parents int // periodic parent jobs (5)
	Slots   int // slots of the class: runs at once (4)
	Keep    int // the class's keep (3)
	DataMiB int // MiB of random data each run writes into its dataset (1)
	// InFlight is how many runs may be forced and not yet ended at once
	// (2 × Slots): enough that runs of one parent overlap, so that some
	// start on a fresh dataset and their parent gathers more archives
	// than one at a time would leave.
	InFlight int
	// MoveReps is how many send/receive pairs the move measure times (5).
	MoveReps  int
	PluginBin string // the built plugin binary
	NomadBin  string // the Nomad agent binary (churn.NomadBinary when empty)
	WorkDir   string // agent directory, backup_dir, the move's pools
	// KeepLog, when set, is where the agent log is copied once the agent
	// has stopped (WorkDir is usually removed).
	KeepLog  string
	Progress io.Writer
}

// Results is what Run measured; cmd/zfsbench writes it as
// bench/periodic-results.json.
type Results struct {
	Machine  bench.Machine `json:"machine"`
	Started  time.Time     `json:"started"`
	Seconds  float64       `json:"seconds"`
	Jobs     int           `json:"jobs"`
	Parents  int           `json:"parents"`
	Slots    int           `json:"slots"`
	Keep     int           `json:"keep"`
	DataMiB  int           `json:"data_mib"`
	InFlight int           `json:"in_flight"`
	Runs     []Child       `json:"runs"`
	// ChurnSeconds runs from the first force to the last allocation
	// terminal; SettleSeconds from there until the plugin had settled.
	ChurnSeconds  float64 `json:"churn_seconds"`
	JobsPerSecond float64 `json:"jobs_per_second"`
	SettleSeconds float64 `json:"settle_seconds"`
	Failed        int     `json:"failed"`
	// Archive is the archive as the plugin left it, and the most archives
	// of one parent seen in the samples taken during the churn.
	Archive ArchiveFigures `json:"archive"`
	// Backup is backup_dir as the plugin left it, and after retention
	// with its grace over.
	Backup BackupFigures `json:"backup_dir"`
	// Move is the keeper's send and receive against a raw zfs send |
	// zfs receive of the same snapshot (bench.RunMove).
	Move *bench.MobilityResult `json:"move,omitempty"`
	Rows []Row                 `json:"rows"`
	// Violations are the bounds the run broke; any fails the run.
	Violations []string `json:"violations,omitempty"`
	Warnings   []string `json:"plugin_warnings,omitempty"`
	Notes      []string `json:"notes,omitempty"`
	AgentLog   string   `json:"agent_log"`
}

// ErrBound is the error of a run that measured everything and broke a
// bound (Results.Violations says which).
var ErrBound = errors.New("a bound of the periodic scenario is broken")

// Run runs the scenario on a pool made for it and returns its figures,
// with an error matching ErrBound when a bound is broken. Every process it
// starts is stopped and every pool it makes destroyed before it returns.
func Run(ctx context.Context, o Options) (res *Results, err error) {
	o = o.withDefaults()
	if o.Jobs < o.Parents {
		return nil, fmt.Errorf("periodic: jobs = %d: want at least one run per parent (parents = %d)", o.Jobs, o.Parents)
	}
	if o.NomadBin == "" {
		if o.NomadBin, err = churn.NomadBinary(); err != nil {
			return nil, err
		}
	}
	res = &Results{Machine: bench.ThisMachine(), Started: time.Now(), Jobs: o.Jobs, Parents: o.Parents,
		Slots: o.Slots, Keep: o.Keep, DataMiB: o.DataMiB, InFlight: o.InFlight}
	defer func() { res.Seconds = time.Since(res.Started).Seconds() }()
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "[periodic] %s\n", fmt.Sprintf(format, args...))
	}

	pool, parent, destroy, err := bench.NewParent(ctx, 1<<30)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := destroy(); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	dir := filepath.Join(o.WorkDir, "periodic")
	backups := filepath.Join(dir, "backups")
	if err := os.MkdirAll(backups, 0o700); err != nil {
		return nil, err
	}
	chroot, err := localagent.ChrootEnv(ctx, []string{"/bin/sh", "/bin/dd"}, nil)
	if err != nil {
		return nil, err
	}
	pluginDir, err := churn.PluginDir(dir, o.PluginBin)
	if err != nil {
		return nil, err
	}
	logf("starting nomad agent (%s), pool %s, backup_dir %s", o.NomadBin, pool.Name, backups)
	a, err := nomadtest.Start(ctx, o.NomadBin, nomadtest.Options{
		Dir: dir, PluginDir: pluginDir, StopTimeout: agentStopTimeout, Chroot: chroot,
		PluginConfig: pluginConfig(parent, backups, o),
	})
	if err != nil {
		return nil, err
	}
	res.AgentLog = a.LogPath
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		serr := a.Stop()
		res.Warnings = pluginWarnings(a.LogPath)
		if o.KeepLog != "" {
			if cerr := copyFile(a.LogPath, o.KeepLog); cerr == nil {
				res.AgentLog = o.KeepLog
			}
		}
		return serr
	}
	defer func() {
		if serr := stop(); serr != nil {
			err = errors.Join(err, serr)
		}
	}()

	r := &periodicRun{o: o, a: a, res: res, logf: logf, parent: parent, backups: backups,
		client: zfs.NewClient(&zfs.Runner{})}
	if err := r.run(ctx); err != nil {
		return res, err
	}
	// The plugin is gone before backup_dir is pruned with the grace over
	// and the move is measured: no keeper of its runs beside them.
	if err := stop(); err != nil {
		return res, fmt.Errorf("stopping the agent: %w", err)
	}
	if err := r.pruneGraceOver(ctx); err != nil {
		return res, err
	}
	logf("move through backup_dir against zfs send | zfs receive, %d MiB, %d pairs", o.DataMiB, o.MoveReps)
	res.Move, err = bench.RunMove(ctx, bench.MobilityOptions{Reps: o.MoveReps, DataMiB: o.DataMiB,
		WorkDir: filepath.Join(dir, "move"), Progress: o.Progress})
	if err != nil {
		return res, fmt.Errorf("the move measure: %w", err)
	}
	res.Rows = rows(res)
	if len(res.Violations) > 0 {
		return res, fmt.Errorf("%w: %s", ErrBound, strings.Join(res.Violations, "; "))
	}
	return res, nil
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Jobs, 200)
	def(&o.Parents, 5)
	def(&o.Slots, 4)
	def(&o.Keep, 3)
	def(&o.DataMiB, 1)
	def(&o.InFlight, 2*o.Slots)
	def(&o.MoveReps, 5)
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// pluginConfig is the plugin block: one class that archives each run's
// dataset, restores it to the parent's next run on this node
// (best-effort: a run that starts while another of its parent holds the
// data starts empty), keeps o.Keep archives per identity, and backs them
// up into backups.
func pluginConfig(parent, backups string, o Options) string {
	return fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "5s"
    backup_dir         = %q
    class %q {
      slots      = %d
      quota      = "32M"
      on_release = "archive"
      restore    = "best-effort"
      keep       = %d
    }
  }
}`, parent, backups, class, o.Slots, o.Keep)
}

// periodicRun is one run of the scenario.
type periodicRun struct {
	o       Options
	a       *nomadtest.Agent
	res     *Results
	logf    func(string, ...any)
	parent  string // the parent dataset
	backups string // backup_dir
	client  *zfs.Client
}

func (r *periodicRun) run(ctx context.Context) error {
	if err := r.waitDevices(ctx); err != nil {
		return err
	}
	if err := r.registerParents(); err != nil {
		return err
	}
	if err := r.churn(ctx); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if err := r.measureArchive(ctx); err != nil {
		return err
	}
	return r.measureBackupDir()
}

func (r *periodicRun) violate(format string, args ...any) {
	v := fmt.Sprintf(format, args...)
	r.res.Violations = append(r.res.Violations, v)
	r.logf("BOUND BROKEN: %s", v)
}

// container is the archive container, <parent>/.archive.
func (r *periodicRun) container() string { return slots.Config{Parent: r.parent}.ArchiveDataset() }

// classDataset holds the class's slot datasets.
func (r *periodicRun) classDataset() string {
	return slots.Config{Parent: r.parent}.ClassDataset(class)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
