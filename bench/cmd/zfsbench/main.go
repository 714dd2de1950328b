// Command zfsbench is `make bench`: it measures nomad-device-zfs on real,
// file-backed pools against floors measured in the same run (see
// bench/README.md), prints one markdown table per size and writes the
// results as JSON.
//
// It starts zfs-fuse when no ZFS answers and stops it (by the PID it started)
// at the end; a daemon that was already running is left alone. Every pool it
// creates is destroyed. Run it as root from the repository root:
//
//	go run ./bench/cmd/zfsbench [-sizes 10,100,900] [-reps 15] [-out bench/results.json]
//	go run ./bench/cmd/zfsbench -churn [-churn-jobs 40] [-churn-out bench/churn-results.json] [-null-plugin BIN]
//	go run ./bench/cmd/zfsbench -periodic [-periodic-jobs 200] [-periodic-parents 5] [-periodic-out bench/periodic-results.json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/bench/churn"
	"github.com/nomad-device-zfs/nomad-device-zfs/bench/periodic"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/pluginhost"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/sandbox"
)

// buildTimeout bounds the build of the plugin (a cold build cache included).
const buildTimeout = 10 * time.Minute

func main() { os.Exit(run()) }

func run() int {
	sizes := flag.String("sizes", defaultSizes(), "comma-separated slot counts, one pool each (2000 only with the kernel module: zfs-fuse mounts at most ~999)")
	reps := flag.Int("reps", 15, "interleaved plugin/floor repetitions per timed measure")
	creates := flag.Int("creates", 30, "create+mount floor samples per size")
	out := flag.String("out", "bench/results.json", "where to write the results as JSON")
	pluginBin := flag.String("plugin", "", "plugin binary for the memory measure (built from ./cmd/nomad-device-zfs when empty)")
	nullBin := flag.String("null-plugin", "", "the churn's control device plugin (built from ./bench/cmd/nulldevice when empty)")
	wantChurn := flag.Bool("churn", false, "run the churn scenario (a real Nomad agent, see bench/README.md) instead of the pool sizes")
	churnJobs := flag.Int("churn-jobs", 40, "jobs per churn batch")
	churnOut := flag.String("churn-out", "bench/churn-results.json", "where -churn writes its results as JSON")
	mobility := flag.Bool("mobility", false, "measure the data following a job (restore on the same node, the move through backup_dir) instead of the pool sizes")
	mobilityOut := flag.String("mobility-out", "bench/mobility-results.json", "where -mobility writes its results as JSON")
	mobilityMiB := flag.Int("mobility-mib", 64, "MiB of data the tenant leaves, for -mobility")
	golden := flag.Bool("golden", false, "measure fresh slots of a class with a golden source (clones) against empty slots, the raw clone and create + copy, instead of the pool sizes")
	goldenOut := flag.String("golden-out", "bench/golden-results.json", "where -golden writes its results as JSON")
	goldenMiB := flag.Int("golden-mib", 64, "MiB of golden files, for -golden")
	goldenFiles := flag.Int("golden-files", 256, "how many golden files, for -golden")
	wantPeriodic := flag.Bool("periodic", false, "run the periodic scenario (short runs of periodic jobs with archive and backup_dir on a real Nomad agent: archives per parent against keep, bytes kept per job, backup_dir against its retention) instead of the pool sizes")
	periodicJobs := flag.Int("periodic-jobs", 200, "runs in all, for -periodic")
	periodicParents := flag.Int("periodic-parents", 5, "periodic parent jobs, for -periodic")
	periodicOut := flag.String("periodic-out", "bench/periodic-results.json", "where -periodic writes its results as JSON")
	flag.Parse()

	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 4 {
			fmt.Fprintf(os.Stderr, "zfsbench: -sizes: %q is not a slot count of at least 4\n", f)
			return 2
		}
		ns = append(ns, n)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	work, err := os.MkdirTemp("", "zfsbench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "zfsbench:", err)
		return 1
	}
	defer os.RemoveAll(work)

	if *pluginBin == "" {
		*pluginBin = filepath.Join(work, "nomad-device-zfs")
		fmt.Fprintln(os.Stderr, "zfsbench: building the plugin")
		bctx, bcancel := context.WithTimeout(ctx, buildTimeout)
		err := pluginhost.Build(bctx, *pluginBin, "-trimpath")
		bcancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "zfsbench:", err)
			return 1
		}
	}

	stop, err := sandbox.StartFuse()
	if err != nil {
		fmt.Fprintln(os.Stderr, "zfsbench: no usable ZFS:", err)
		return 1
	}
	if stop != nil {
		fmt.Fprintln(os.Stderr, "zfsbench: started zfs-fuse; it is stopped at the end")
		defer func() {
			if err := stop(); err != nil {
				fmt.Fprintln(os.Stderr, "zfsbench: stopping zfs-fuse:", err)
			}
		}()
	}

	if *golden {
		res, err := bench.RunGolden(ctx, bench.GoldenOptions{Reps: *reps, Files: *goldenFiles, MiB: *goldenMiB, WorkDir: work, Progress: os.Stderr})
		fmt.Println()
		bench.WriteGolden(os.Stdout, res)
		return finish("golden", res, err, *goldenOut)
	}
	if *mobility {
		return runMobility(ctx, bench.MobilityOptions{Reps: *reps, DataMiB: *mobilityMiB, WorkDir: work, Progress: os.Stderr}, *mobilityOut)
	}
	if *wantPeriodic {
		keep := filepath.Join(os.TempDir(), "zfsbench-periodic-"+time.Now().UTC().Format("20060102T150405")+"-agent.log")
		fmt.Fprintln(os.Stderr, "zfsbench: the agent log is kept as", keep)
		return runPeriodic(ctx, periodic.Options{Jobs: *periodicJobs, Parents: *periodicParents, MoveReps: *reps,
			PluginBin: *pluginBin, WorkDir: work, KeepLog: keep, Progress: os.Stderr}, *periodicOut)
	}
	if *wantChurn {
		// A log per run: a run that stalls is looked at after the next.
		keep := filepath.Join(os.TempDir(), "zfsbench-churn-"+time.Now().UTC().Format("20060102T150405")+"-agent.log")
		fmt.Fprintln(os.Stderr, "zfsbench: the agent log is kept as", keep)
		if *nullBin == "" {
			*nullBin = filepath.Join(work, "nomad-device-null")
			fmt.Fprintln(os.Stderr, "zfsbench: building the null device plugin")
			bctx, bcancel := context.WithTimeout(ctx, buildTimeout)
			err := pluginhost.BuildPackage(bctx, "github.com/nomad-device-zfs/nomad-device-zfs/bench/cmd/nulldevice", "the null device plugin", *nullBin, "-trimpath")
			bcancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, "zfsbench:", err)
				return 1
			}
		}
		return runChurn(ctx, churn.Options{Jobs: *churnJobs, PluginBin: *pluginBin, NullBin: *nullBin, WorkDir: work, KeepLog: keep, Progress: os.Stderr}, *churnOut)
	}

	res, err := bench.Run(ctx, bench.Options{Sizes: ns, Reps: *reps, Creates: *creates, PluginBin: *pluginBin, WorkDir: work, Progress: os.Stderr})
	if res == nil {
		fmt.Fprintln(os.Stderr, "zfsbench:", err)
		return 1
	}
	fmt.Println()
	bench.WriteMarkdown(os.Stdout, res)
	fmt.Println()
	bench.WriteNotes(os.Stdout, res)

	b, jerr := json.MarshalIndent(res, "", "  ")
	if jerr == nil {
		jerr = os.WriteFile(*out, append(b, '\n'), 0o644)
	}
	if jerr != nil {
		fmt.Fprintln(os.Stderr, "zfsbench: writing results:", jerr)
		return 1
	}
	fmt.Fprintf(os.Stderr, "zfsbench: wrote %s\n", *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "zfsbench:", err)
		return 1
	}
	for _, s := range res.Sizes {
		if s.Error != "" {
			return 1 // a size could not be measured; targets are reported, not enforced
		}
	}
	return 0
}

// runMobility runs the mobility measures, prints their table and writes
// their results to out.
func runMobility(ctx context.Context, o bench.MobilityOptions, out string) int {
	res, err := bench.RunMobility(ctx, o)
	fmt.Println()
	bench.WriteMobility(os.Stdout, res)
	return finish("mobility", res, err, out)
}

// runChurn runs the churn scenario, prints its table and writes its
// results to out.
func runChurn(ctx context.Context, o churn.Options, out string) int {
	res, err := churn.Run(ctx, o)
	if res == nil {
		fmt.Fprintln(os.Stderr, "zfsbench: churn:", err)
		return 1
	}
	fmt.Println()
	churn.WriteMarkdown(os.Stdout, res)
	return finish("churn", res, err, out)
}

// runPeriodic runs the periodic scenario, prints its table and writes its
// results to out.
func runPeriodic(ctx context.Context, o periodic.Options, out string) int {
	res, err := periodic.Run(ctx, o)
	if res == nil {
		fmt.Fprintln(os.Stderr, "zfsbench: periodic:", err)
		return 1
	}
	fmt.Println()
	periodic.WriteMarkdown(os.Stdout, res)
	return finish("periodic", res, err, out)
}

// finish writes a scenario's results to out as JSON and returns the exit
// status: 1 when they cannot be written or the scenario failed (err).
func finish(scenario string, res any, err error, out string) int {
	b, jerr := json.MarshalIndent(res, "", "  ")
	if jerr == nil {
		jerr = os.WriteFile(out, append(b, '\n'), 0o644)
	}
	if jerr != nil {
		fmt.Fprintf(os.Stderr, "zfsbench: writing %s results: %v\n", scenario, jerr)
		return 1
	}
	fmt.Fprintf(os.Stderr, "zfsbench: wrote %s\n", out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zfsbench: %s: %v\n", scenario, err)
		return 1
	}
	return 0
}

// defaultSizes is 10, 100 and 900 slots, and 2000 where the kernel module
// is present.
func defaultSizes() string {
	if _, err := os.Stat("/dev/zfs"); err == nil {
		return "10,100,900,2000"
	}
	return "10,100,900"
}
