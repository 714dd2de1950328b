package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// GoldenOptions configures RunGolden.
type GoldenOptions struct {
	// Reps is how many fresh slots each way is timed.
	Reps int
	// Files and MiB are what the golden snapshot holds: Files files
	// adding up to MiB MiB of random data.
	Files, MiB int
	WorkDir    string
	// Progress receives a line per step; nil for none.
	Progress io.Writer
}

// GoldenResult is what RunGolden measured: the plugin making a fresh slot
// of a class with a source (a clone) against the same for an empty class,
// against the raw `zfs clone`, and against what an operator does without
// a source (`zfs create`, then copy the same files in).
type GoldenResult struct {
	Reps  int `json:"reps"`
	Files int `json:"files"`
	MiB   int `json:"mib"`
	// The plugin: a Sync that makes one more slot (the class's slots
	// raised by one), for the golden class and for an empty one.
	GoldenP50 time.Duration `json:"golden_p50_ns"`
	EmptyP50  time.Duration `json:"empty_p50_ns"`
	// Raw ZFS: `zfs clone` of the snapshot; `zfs create` then `cp -a` of
	// the golden files.
	RawCloneP50 time.Duration `json:"raw_clone_p50_ns"`
	CopyP50     time.Duration `json:"copy_p50_ns"`
	// Ratios: golden against the raw clone, against the plugin's empty
	// slot, and against create-and-copy.
	GoldenVsClone float64 `json:"golden_vs_clone"`
	GoldenVsEmpty float64 `json:"golden_vs_empty"`
	GoldenVsCopy  float64 `json:"golden_vs_copy"`
	Error         string  `json:"error,omitempty"`
}

// RunGolden measures golden-source slots on a pool of its own (ZFS must
// answer: see sandbox.StartFuse). It returns what it measured, with Error
// set when a step failed.
func RunGolden(ctx context.Context, o GoldenOptions) (*GoldenResult, error) {
	r := &GoldenResult{Reps: o.Reps, Files: o.Files, MiB: o.MiB}
	if err := r.run(ctx, o); err != nil {
		r.Error = err.Error()
		return r, err
	}
	return r, nil
}

func (r *GoldenResult) run(ctx context.Context, o GoldenOptions) error {
	logf := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "golden: "+format+"\n", args...)
		}
	}
	p, done, err := mobilityPool(ctx, o.WorkDir, "golden")
	if err != nil {
		return err
	}
	defer done()
	runner := &zfs.Runner{}
	gold := p.Dataset("golden")
	if _, err := runner.ZFSCmd(ctx, "create", gold); err != nil {
		return err
	}
	goldMP := filepath.Join(p.Mountpoint, "golden")
	per := (o.MiB << 20) / max(o.Files, 1)
	buf := make([]byte, per)
	for i := 0; i < o.Files; i++ {
		if _, err := rand.Read(buf); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(goldMP, fmt.Sprintf("f%04d", i)), buf, 0o644); err != nil {
			return err
		}
	}
	src := gold + "@v1"
	if _, err := runner.ZFSCmd(ctx, "snapshot", src); err != nil {
		return err
	}
	logf("golden snapshot %s: %d files, %d MiB", src, o.Files, o.MiB)

	// The plugin: one class each, grown by one slot per timed Sync.
	grow := func(source string) ([]time.Duration, error) {
		cl := slots.Class{Name: "empty", Quota: 256 << 20, UID: 65534, GID: 65534, Mode: 0o770, OnRelease: slots.OnReleaseDestroy}
		if source != "" {
			cl.Name, cl.Source = "golden", source
		}
		cfg := slots.Config{Parent: p.Dataset("nomad"), Classes: []slots.Class{cl}}
		mgr := slots.NewManager(zfs.NewClient(runner), hclog.NewNullLogger())
		defer func() { _ = mgr.Wait(context.Background()) }()
		mgr.SetConfig(cfg)
		if err := mgr.Sync(ctx); err != nil { // the class container
			return nil, err
		}
		var out []time.Duration
		for i := 1; i <= o.Reps; i++ {
			cfg.Classes[0].Slots = i
			mgr.SetConfig(cfg)
			start := time.Now()
			if err := mgr.Sync(ctx); err != nil {
				return nil, err
			}
			out = append(out, time.Since(start))
			s := mgr.Slots()
			if len(s) != i || !s[i-1].Healthy {
				return nil, fmt.Errorf("%s slot %d not made: %+v", cl.Name, i-1, s)
			}
		}
		return out, nil
	}
	golden, err := grow(src)
	if err != nil {
		return err
	}
	empty, err := grow("")
	if err != nil {
		return err
	}
	r.GoldenP50, r.EmptyP50 = Percentile(golden, 50), Percentile(empty, 50)
	logf("plugin: golden slot p50 %s, empty slot p50 %s", r.GoldenP50, r.EmptyP50)

	// Raw ZFS, into a container of its own.
	floor := p.Dataset("floor")
	if _, err := runner.ZFSCmd(ctx, "create", floor); err != nil {
		return err
	}
	var clones, copies []time.Duration
	for i := 0; i < o.Reps; i++ {
		name := fmt.Sprintf("%s/c%d", floor, i)
		start := time.Now()
		if _, err := runner.ZFSCmd(ctx, "clone", src, name); err != nil {
			return err
		}
		clones = append(clones, time.Since(start))

		name = fmt.Sprintf("%s/k%d", floor, i)
		start = time.Now()
		if _, err := runner.ZFSCmd(ctx, "create", name); err != nil {
			return err
		}
		if out, err := exec.CommandContext(ctx, "cp", "-a", goldMP+"/.", filepath.Join(p.Mountpoint, "floor", fmt.Sprintf("k%d", i))).CombinedOutput(); err != nil {
			return fmt.Errorf("cp -a: %v: %s", err, out)
		}
		copies = append(copies, time.Since(start))
		// The copies hold real blocks: the pool has room for one at a time.
		if _, err := runner.ZFSCmd(ctx, "destroy", name); err != nil {
			return err
		}
	}
	r.RawCloneP50, r.CopyP50 = Percentile(clones, 50), Percentile(copies, 50)
	r.GoldenVsClone = durRatio(r.GoldenP50, r.RawCloneP50)
	r.GoldenVsEmpty = durRatio(r.GoldenP50, r.EmptyP50)
	r.GoldenVsCopy = durRatio(r.GoldenP50, r.CopyP50)
	logf("raw clone p50 %s, create + cp -a p50 %s", r.RawCloneP50, r.CopyP50)
	return nil
}

// WriteGolden prints the golden-source figures as a Markdown table.
func WriteGolden(w io.Writer, r *GoldenResult) {
	fmt.Fprintf(w, "| a fresh slot (%d files, %d MiB golden, %d reps) | p50 | golden slot against it |\n|---|---|---|\n", r.Files, r.MiB, r.Reps)
	fmt.Fprintf(w, "| plugin, class with a source (clone + marks + mount chores) | %s | 1.00 |\n", r.GoldenP50.Round(time.Millisecond))
	fmt.Fprintf(w, "| raw `zfs clone` of the snapshot | %s | %.2f |\n", r.RawCloneP50.Round(time.Millisecond), r.GoldenVsClone)
	fmt.Fprintf(w, "| plugin, empty class (`zfs create` + chores) | %s | %.2f |\n", r.EmptyP50.Round(time.Millisecond), r.GoldenVsEmpty)
	fmt.Fprintf(w, "| `zfs create` + `cp -a` of the same files | %s | %.2f |\n", r.CopyP50.Round(time.Millisecond), r.GoldenVsCopy)
}
