package bench_test

import (
	"context"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/device"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
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

	// A stand-in comes before the background parts start, never after.
	must.Error(t, firstStarted(t, block, n).UseAllocations(bench.NewTenants()))

	// Either way the Reserve starts no zfs process: a slot adopted in
	// memory is a fresh slot to this run, and the Reserve's own proof is a
	// read of the stand-in and of the slot's root.
	cases := []struct {
		name  string
		adopt bool
	}{
		// As every step of the sizes run: its plugin's first pass first.
		{name: "after the first pass", adopt: true},
		// Without that pass the Reserve proves the slot unheld itself.
		{name: "on the Reserve's path", adopt: false},
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
			must.EqOp(t, int64(0), r.Runs()-before)
			must.SliceLen(t, 1, res.GetMounts())
			must.True(t, bench.Mounted(res.GetMounts()[0].GetHostPath()))
			must.NoError(t, p.Settle(ctx))
		})
	}
}

// firstStarted is a plugin of the bench's whose fingerprint stream has
// begun, and with it the background parts.
func firstStarted(t *testing.T, block string, n int) *device.Plugin {
	t.Helper()
	p := device.New(hclog.NewNullLogger(), &zfs.Runner{})
	t.Cleanup(p.Close)
	conn, stop, err := nomadplugin.Connect(p)
	must.NoError(t, err)
	t.Cleanup(stop)
	must.NoError(t, bench.Configure(context.Background(), conn, block))
	end, err := bench.FirstFingerprint(conn, n, 5*time.Minute)
	must.NoError(t, err)
	end()
	return p
}
