package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// The sizes run starts a new in-process plugin for each step on slots an
// earlier plugin made armed (its run's): each must hand them over as a
// restarted plugin does with Nomad's answer, after its first pass with no
// zfs command on the Reserve (zfsbench -sizes failed here: "holds the data
// of an unknown allocation").
func TestPlugin_AStepAfterAnotherReservesItsSlots(t *testing.T) {
	ctx := context.Background()
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	const n = 3
	block := bench.PluginConfig(parent, n, "1h", "1h")

	start := func(t *testing.T, r *zfs.Runner) *bench.Plugin {
		t.Helper()
		p, err := bench.NewPlugin(r)
		must.NoError(t, err)
		t.Cleanup(p.Close)
		must.NoError(t, bench.Configure(ctx, p.Conn, block))
		stop, err := bench.FirstFingerprint(p.Conn, n, 5*time.Minute)
		must.NoError(t, err)
		stop()
		return p
	}
	first := start(t, &zfs.Runner{}) // provisions: its run arms the datasets
	first.Close()

	cases := []struct {
		name  string
		adopt bool
		procs int64 // zfs processes the Reserve itself may start
	}{
		// The step's plugin runs its first pass before it is measured:
		// the Reserve is a fresh slot's, with no command.
		{name: "after the first pass", adopt: true, procs: 0},
		// Without that pass the Reserve proves the slot unheld itself
		// (a read of the stand-in, the root checked empty), still with
		// no command.
		{name: "on the Reserve's path", adopt: false, procs: 0},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &zfs.Runner{}
			p := start(t, r)
			if tc.adopt {
				must.NoError(t, p.Adopt(ctx))
			}
			before := r.Runs()
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			res, err := bench.Reserve(rctx, p.Conn, bench.DeviceID(i))
			must.NoError(t, err)
			must.EqOp(t, tc.procs, r.Runs()-before)
			must.SliceLen(t, 1, res.GetMounts())
			must.True(t, bench.Mounted(res.GetMounts()[0].GetHostPath()))
			must.NoError(t, p.Settle(ctx))
		})
	}
}
