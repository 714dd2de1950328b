package bench_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// TestProcessCounts proves the cost rules on a real pool, counting every zfs
// and zpool process through wrapper scripts placed in front of the real
// commands: one `zfs get` per stats refresh and exactly `zpool list` +
// `zfs get` per fingerprint refresh with nothing to change, whatever the
// number of slots, one zfs process for Reserve on a free slot (and one
// behind it for its spare), and the same few commands for the release of
// a slot, none of which reads the whole tree.
func TestProcessCounts(t *testing.T) {
	sizes := []struct {
		name  string
		slots int
	}{
		{name: "10 slots", slots: 10},
		{name: "200 slots", slots: 200},
	}
	for _, size := range sizes {
		t.Run(size.name, func(t *testing.T) {
			env := newEnv(t, size.slots)

			checks := []struct {
				name string
				// setup prepares one call (not counted) and returns it.
				setup func(t *testing.T) func(ctx context.Context) error
				want  bench.Counts // exact processes per call; nil: see max
				// optional commands may run up to this many times on top of want.
				optional bench.Counts
				max      int // at most this many processes per call
				calls    int
			}{
				{
					name:  "stats refresh",
					setup: same(env.mgr.Refresh),
					want:  bench.Counts{"zfs get -r": 1},
					calls: 3,
				},
				{
					name:  "fingerprint refresh with nothing to change",
					setup: same(env.mgr.Sync),
					want:  bench.Counts{"zpool list": 1, "zfs get -r": 1},
					calls: 3,
				},
				{
					// The Reserve runs no zfs command (the dataset is
					// armed); behind it, a pass records its owner (one zfs
					// set), and then the slot's spare is made: one zfs
					// create, and no read (the mount table shows where it
					// is mounted).
					name: "Reserve on a free slot, its owner, and its spare",
					setup: func(t *testing.T) func(context.Context) error {
						id := env.nextFree(t)
						return func(ctx context.Context) error {
							env.tenants.Hold(id)
							if _, err := env.mgr.Reserve(ctx, []string{id}); err != nil {
								return err
							}
							if err := env.mgr.ReleaseEnded(ctx); err != nil {
								return err
							}
							return env.mgr.Wait(ctx)
						}
					},
					want:  bench.Counts{"zfs set": 1, "zfs create": 1},
					calls: 3,
				},
				{
					// The next tenant of a slot whose owner has ended: the
					// owner's dataset's fate on Reserve's path (the spare,
					// armed, is handed over with no command); behind it
					// the unmount (`zfs set canmount=off`: it unmounts, and
					// nothing mounts the dataset again by itself), rename
					// into the archive, the new owner recorded, and the next
					// spare made under the released name. No read.
					name: "Reserve by the next tenant, and the release behind it",
					setup: func(t *testing.T) func(context.Context) error {
						id := env.nextFree(t)
						o, err := bench.Tenancy(context.Background(), env.mgr, env.tenants, id)
						must.NoError(t, err)
						return func(ctx context.Context) error {
							env.tenants.End(o)
							env.tenants.Next(id)
							if _, err := env.mgr.Reserve(ctx, []string{id}); err != nil {
								return err
							}
							if err := env.mgr.Wait(ctx); err != nil {
								return err
							}
							if err := env.mgr.ReleaseEnded(ctx); err != nil {
								return err
							}
							return env.mgr.Wait(ctx)
						}
					},
					want:     bench.Counts{"zfs set": 3, "zfs rename": 1, "zfs create": 1},
					optional: bench.Counts{"zpool list": 1},
					calls:    2,
				},
				{
					// Record the release (the dataset's fate, archived):
					// the spare serves at once. Behind it the unmount
					// (canmount=off), rename into the archive; no read, and no
					// dataset made (the spare was). The pool's health is
					// read unless a check found it ONLINE in the last 5 s
					// (as the fingerprint refresh does).
					name: "release of a slot whose allocation ended",
					setup: func(t *testing.T) func(context.Context) error {
						id := env.nextFree(t)
						o, err := bench.Tenancy(context.Background(), env.mgr, env.tenants, id)
						must.NoError(t, err)
						return func(ctx context.Context) error {
							_, err := bench.TimedRelease(ctx, env.mgr, env.tenants, id, o)
							return err
						}
					},
					want:     bench.Counts{"zfs set": 2, "zfs rename": 1},
					optional: bench.Counts{"zpool list": 1},
					calls:    2,
				},
			}
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) {
					for i := 0; i < c.calls; i++ {
						got := env.count(t, c.setup(t))
						for k, n := range c.optional {
							if got[k] <= n {
								delete(got, k)
							}
						}
						if c.want != nil {
							must.MapEq(t, c.want, got, must.Sprintf("call %d: %s", i+1, got))
						} else {
							must.LessEq(t, c.max, got.Total(), must.Sprintf("call %d: %s", i+1, got))
						}
					}
				})
			}
		})
	}
}

// same returns a setup that prepares nothing and counts f.
func same(f func(context.Context) error) func(*testing.T) func(context.Context) error {
	return func(*testing.T) func(context.Context) error { return f }
}

// env is a plugin and a slot manager on a fresh pool, both running zfs
// through one counter.
type env struct {
	counter  *bench.Counter
	runner   *zfs.Runner
	plugin   *bench.Plugin
	mgr      *slots.Manager
	tenants  *bench.Tenants
	reserved int
	busy     *busyCounter
}

// busyCounter counts the processes that zfs answered "busy": the runner's
// bounded retries of a command ZFS was not ready for (zfs-fuse, for a
// moment after an unmount, more often on a loaded machine). They are the
// same step run again, not more work of the plugin's.
type busyCounter struct {
	mu sync.Mutex
	n  bench.Counts
}

func (b *busyCounter) CommandDone(command, subcommand string, err error, _ time.Duration) {
	if !errors.Is(err, zfs.ErrBusy) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n[command+" "+subcommand]++
}

func (b *busyCounter) snapshot() bench.Counts {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.n)
}

func newEnv(t *testing.T, n int) *env {
	t.Helper()
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	counter, err := bench.NewCounter(t.TempDir())
	must.NoError(t, err)
	e := &env{counter: counter, runner: counter.Runner(), busy: &busyCounter{n: bench.Counts{}}}
	e.runner.Observer = e.busy

	// The plugin provisions the slots and takes its first fingerprint.
	e.plugin, err = bench.NewPlugin(e.runner)
	must.NoError(t, err)
	t.Cleanup(e.plugin.Close)
	must.NoError(t, bench.Configure(context.Background(), e.plugin.Conn, bench.PluginConfig(parent, n, "1h", "1h")))
	stop, err := bench.FirstFingerprint(e.plugin.Conn, n, 5*time.Minute)
	must.NoError(t, err)
	stop() // no background refresh may run while processes are counted

	// A manager with the same configuration: its first Sync adopts them.
	e.mgr = slots.NewManager(zfs.NewClient(e.runner), hclog.NewNullLogger())
	e.tenants = bench.NewTenants()
	e.mgr.SetNomad(e.tenants)
	e.mgr.SetConfig(bench.SlotsConfig(parent, n))
	must.NoError(t, e.mgr.Sync(context.Background()))
	// The plugin's fresh datasets are armed by its run: to this manager, a
	// run after it, they are in use by an unknown allocation until a pass
	// finds nobody holding them and adopts them (internal/slots/armed.go).
	must.NoError(t, e.mgr.ReleaseEnded(context.Background()))
	for _, s := range e.mgr.Slots() {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
		must.EqOp(t, record.StateFree, s.State, must.Sprint(s.ID))
	}
	return e
}

// count runs f and returns the zfs and zpool processes it started, checking
// that the runner's own counter agrees with the wrapper.
func (e *env) count(t *testing.T, f func(context.Context) error) bench.Counts {
	t.Helper()
	before, busyBefore := e.runner.Runs(), e.busy.snapshot()
	got, err := e.counter.Count(func() error { return f(context.Background()) })
	must.NoError(t, err)
	must.Eq(t, int64(got.Total()), e.runner.Runs()-before, must.Sprintf("wrapper counted %s", got))
	// A busy answer retried is the same step again: reported, not counted.
	for k, n := range e.busy.snapshot() {
		if d := n - busyBefore[k]; d > 0 {
			t.Logf("%d× %s answered busy and ran again", d, k)
			got[k] -= d
		}
	}
	return got
}

// nextFree returns the ID of a slot no check has reserved yet.
func (e *env) nextFree(t *testing.T) string {
	t.Helper()
	e.reserved++
	id := bench.DeviceID(e.reserved - 1)
	t.Logf("reserving %s", id)
	return id
}
