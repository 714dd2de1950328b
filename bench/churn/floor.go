package churn

// The floor control (issue 46): the null device's jobs again, each given a
// ZFS dataset of its own and the dataset taken back at its end, with the
// bare ZFS work any implementation of this product must pay per job and
// nothing else. The floor driver (bench/churn/floor) follows the floor
// jobs' allocations, hands each device its spare at its tenant's end and
// makes and destroys the datasets; its package doc says how. The floor
// batches run after the null control's, each after a forced garbage
// collection, on the same agent, with the same batch shape.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench/churn/floor"
)

// errNoFloor: the run has no null device, so no floor control.
var errNoFloor = errors.New("the floor control needs the null device")

// floorControl runs the floor batches: as many as the plugin's, of as many
// jobs, each after a forced garbage collection, with the floor driver taking
// back each job's dataset.
func (r *churnRun) floorControl(ctx context.Context) error {
	if r.o.NullBin == "" {
		return errNoFloor
	}
	devices := make([]string, r.o.Slots)
	for i := range devices {
		devices[i] = nullName + "-" + strconv.Itoa(i)
	}
	f, err := floor.New(ctx, r.a.API, r.counter.Runner(), r.pool+"/floor", filepath.Join(r.dir, "floor"), filepath.Join(r.dir, "null"), "churn-", devices)
	if err != nil {
		return err
	}
	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(fctx, kindFloor) })
	wg.Go(func() { f.DestroyLoop(fctx) })
	defer func() { stop(); wg.Wait() }()
	r.floor = f
	defer func() { r.floor = nil }()
	r.logf("floor: %d batches of %d jobs against the null device, each job's dataset made and destroyed by the floor driver", r.o.Pairs, r.o.Jobs)
	for p := range r.o.Pairs {
		if err := r.emptyNode(ctx, fmt.Sprintf("floor batch %d", p+1)); err != nil {
			return err
		}
		b, err := r.batch(ctx, kindFloor, r.o.Jobs, kindFloor)
		if err != nil {
			return fmt.Errorf("floor batch %d: %w", p+1, err)
		}
		r.logBatch(p, b)
		r.res.Floor = append(r.res.Floor, *b)
	}
	return nil
}
