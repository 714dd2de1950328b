package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/metricstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// fakeSource is a slot view set by the test.
type fakeSource struct {
	mu    sync.Mutex // guards the fields below
	slots []slots.Slot
	avail uint64
	known bool
	// backups is what Backups returns; backupsKnown its known.
	backups      metrics.Backups
	backupsKnown bool
}

func (f *fakeSource) Slots() []slots.Slot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]slots.Slot(nil), f.slots...)
}

func (f *fakeSource) ParentAvailable() (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.avail, f.known
}

func (f *fakeSource) Pool() string { return "tank" }

func (f *fakeSource) Backups() (metrics.Backups, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.backups
	b.Identities = append([]metrics.BackupIdentity(nil), b.Identities...)
	return b, f.backupsKnown
}

func gather(t *testing.T, m *metrics.Metrics) metricstest.Families {
	t.Helper()
	fams, err := m.Registry().Gather()
	must.NoError(t, err)
	return metricstest.FromGathered(fams)
}

func value(t *testing.T, f metricstest.Families, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := f.Value(name, labels)
	must.True(t, ok, must.Sprintf("no %s%v among:\n%s", name, labels, f.Describe("nomad_device_zfs_")))
	return v
}

func TestSlotState(t *testing.T) {
	cases := []struct {
		name string
		slot slots.Slot
		want string
	}{
		{"free and healthy", slots.Slot{State: record.StateFree, Healthy: true}, metrics.StateFree},
		{"free but unhealthy", slots.Slot{State: record.StateFree}, metrics.StateUnhealthy},
		{"reserved", slots.Slot{State: record.StateReserved, Healthy: true}, metrics.StateInUse},
		{"reserved, kept unverified", slots.Slot{State: record.StateReserved}, metrics.StateInUse},
		{"releasing", slots.Slot{State: record.StateReleasing}, metrics.StateReleasing},
		{"releasing, offered meanwhile", slots.Slot{State: record.StateReleasing, Healthy: true}, metrics.StateReleasing},
		{"destroying", slots.Slot{State: record.StateDestroying}, metrics.StateReleasing},
		{"missing", slots.Slot{}, metrics.StateUnhealthy},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, metrics.SlotState(tc.slot))
		})
	}
}

func TestMetrics_Collector(t *testing.T) {
	src := &fakeSource{slots: []slots.Slot{
		{ID: "fast-0", Class: "fast", State: record.StateReserved, Healthy: true, Usage: zfs.Usage{Used: 4096}},
		{ID: "fast-1", Class: "fast", State: record.StateFree, Healthy: true, Usage: zfs.Usage{Used: 100}},
		{ID: "fast-2", Class: "fast", State: record.StateReleasing},
		{ID: "slow-0", Class: "slow", State: record.StateFree},
	}}
	m := metrics.New(src)

	f := gather(t, m)
	for _, tc := range []struct {
		class, state string
		want         float64
	}{
		{"fast", "free", 1}, {"fast", "in_use", 1}, {"fast", "releasing", 1}, {"fast", "unhealthy", 0},
		{"slow", "free", 0}, {"slow", "in_use", 0}, {"slow", "releasing", 0}, {"slow", "unhealthy", 1},
	} {
		must.EqOp(t, tc.want, value(t, f, "nomad_device_zfs_slots", map[string]string{"class": tc.class, "state": tc.state}),
			must.Sprintf("class %s state %s", tc.class, tc.state))
	}
	must.EqOp(t, 4096.0, value(t, f, "nomad_device_zfs_slot_used_bytes", map[string]string{"class": "fast", "device": "fast-0"}))
	_, ok := f.Value("nomad_device_zfs_pool_free_bytes", nil)
	must.False(t, ok, must.Sprint("no pool figure before one was read"))

	src.mu.Lock()
	src.avail, src.known = 1<<30, true
	src.slots[1].State = record.StateReserved
	src.mu.Unlock()
	f = gather(t, m)
	must.EqOp(t, float64(1<<30), value(t, f, "nomad_device_zfs_pool_free_bytes", map[string]string{"pool": "tank"}))
	must.EqOp(t, 2.0, value(t, f, "nomad_device_zfs_slots", map[string]string{"class": "fast", "state": "in_use"}))
	must.EqOp(t, 0.0, value(t, f, "nomad_device_zfs_slots", map[string]string{"class": "fast", "state": "free"}))
}

func TestMetrics_Observers(t *testing.T) {
	m := metrics.New(&fakeSource{})
	var (
		zo zfs.Observer        = m
		so slots.Observer      = m
		ao allocwatch.Observer = m
	)
	zo.CommandDone("zfs", "get", nil, 20*time.Millisecond)
	zo.CommandDone("zfs", "get", nil, 30*time.Millisecond)
	zo.CommandDone("zfs", "destroy", &zfs.Error{Kind: zfs.ErrBusy}, time.Millisecond)
	zo.CommandDone("zpool", "list", &zfs.Error{Err: context.DeadlineExceeded}, time.Second)
	so.ReserveDone(slots.ReserveFresh, time.Millisecond)
	so.ReserveDone(slots.ReserveWaited, time.Second)
	so.ReserveDone(slots.ReserveFailed, 2*time.Minute)
	so.ReleaseStarted("scratch")
	so.ReleaseDone("scratch", nil, 500*time.Millisecond)
	so.ReleaseDone("scratch", errors.New("zfs rename: dataset is busy"), time.Second)
	ao.ReadFailed(allocwatch.CallNodeAllocations, fmt.Errorf("GET: %w", allocwatch.ErrPermission))
	ao.ReadFailed(allocwatch.CallAllocation, fmt.Errorf("lookup: %w", context.DeadlineExceeded))
	ao.ReadFailed(allocwatch.CallVisibility, errors.New("connection refused"))

	f := gather(t, m)
	cases := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"nomad_device_zfs_zfs_command_duration_seconds", map[string]string{"command": "zfs", "subcommand": "get", "outcome": "ok"}, 2},
		{"nomad_device_zfs_zfs_command_duration_seconds", map[string]string{"command": "zfs", "subcommand": "destroy", "outcome": "busy"}, 1},
		{"nomad_device_zfs_zfs_command_duration_seconds", map[string]string{"command": "zpool", "subcommand": "list", "outcome": "timeout"}, 1},
		{"nomad_device_zfs_reserve_duration_seconds", map[string]string{"outcome": "fresh"}, 1},
		{"nomad_device_zfs_reserve_duration_seconds", map[string]string{"outcome": "waited"}, 1},
		{"nomad_device_zfs_reserve_duration_seconds", map[string]string{"outcome": "failed"}, 1},
		{"nomad_device_zfs_releases_started_total", map[string]string{"class": "scratch"}, 1},
		{"nomad_device_zfs_release_duration_seconds", map[string]string{"class": "scratch", "outcome": "ok"}, 1},
		{"nomad_device_zfs_release_duration_seconds", map[string]string{"class": "scratch", "outcome": "error"}, 1},
		{"nomad_device_zfs_nomad_api_read_failures_total", map[string]string{"call": "node_allocations", "reason": "permission"}, 1},
		{"nomad_device_zfs_nomad_api_read_failures_total", map[string]string{"call": "allocation", "reason": "timeout"}, 1},
		{"nomad_device_zfs_nomad_api_read_failures_total", map[string]string{"call": "visibility", "reason": "error"}, 1},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.name, tc.labels), func(t *testing.T) {
			must.EqOp(t, tc.want, value(t, f, tc.name, tc.labels))
		})
	}
}

func TestZFSOutcome(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{&zfs.Error{Kind: zfs.ErrNotExist}, "not_exist"},
		{&zfs.Error{Kind: zfs.ErrBusy}, "busy"},
		{&zfs.Error{Kind: zfs.ErrUnavailable}, "unavailable"},
		{&zfs.Error{Kind: zfs.ErrNoSpace}, "no_space"},
		{&zfs.Error{Kind: zfs.ErrInvalid}, "invalid"},
		{&zfs.Error{Err: context.DeadlineExceeded}, "timeout"},
		{&zfs.Error{ExitCode: 1}, "error"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			must.EqOp(t, tc.want, zfs.Outcome(tc.err))
		})
	}
}

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	ports, err := localagent.FreeLoopbackPorts(1)
	must.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}

// serving starts m's server at addr, stopped at cleanup.
func serving(t *testing.T, m *metrics.Metrics, addr string) {
	t.Helper()
	must.NoError(t, m.Serve(addr, hclog.NewNullLogger()))
	t.Cleanup(func() { m.Close(hclog.NewNullLogger()) })
}

func TestMetrics_Server(t *testing.T) {
	ctx := context.Background()
	src := &fakeSource{slots: []slots.Slot{{ID: "a-0", Class: "a", State: record.StateReserved}}}
	m := metrics.New(src)
	addr := freeAddr(t)
	serving(t, m, addr)
	m.ReserveDone(slots.ReserveFresh, time.Millisecond)

	f, err := metricstest.Scrape(ctx, "http://"+addr+metrics.Path)
	must.NoError(t, err)
	must.EqOp(t, 1.0, value(t, f, "nomad_device_zfs_slots", map[string]string{"class": "a", "state": "in_use"}))
	must.EqOp(t, 1.0, value(t, f, "nomad_device_zfs_reserve_duration_seconds", map[string]string{"outcome": "fresh"}))

	// The same address again changes nothing.
	must.NoError(t, m.Serve(addr, hclog.NewNullLogger()))
	_, err = metricstest.Scrape(ctx, "http://"+addr+metrics.Path)
	must.NoError(t, err)

	// An address taken by another listener is an error; the server at
	// the old address goes on.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	err = m.Serve(taken.Addr().String(), hclog.NewNullLogger())
	must.ErrorContains(t, err, "listening")
	_, err = metricstest.Scrape(ctx, "http://"+addr+metrics.Path)
	must.NoError(t, err)

	// A new address: served there, and no longer at the old one.
	addr2 := freeAddr(t)
	must.NoError(t, m.Serve(addr2, hclog.NewNullLogger()))
	_, err = metricstest.Scrape(ctx, "http://"+addr2+metrics.Path)
	must.NoError(t, err)
	_, err = metricstest.Scrape(ctx, "http://"+addr+metrics.Path)
	must.Error(t, err)

	// No address: nothing served.
	must.NoError(t, m.Serve("", hclog.NewNullLogger()))
	_, err = metricstest.Scrape(ctx, "http://"+addr2+metrics.Path)
	must.Error(t, err)

	// Close is idempotent.
	m.Close(hclog.NewNullLogger())
	m.Close(hclog.NewNullLogger())
}

func TestValidateAddress(t *testing.T) {
	cases := []struct {
		addr, wantErr string
	}{
		{"127.0.0.1:9715", ""},
		{":9715", ""},
		{"[::1]:9715", ""},
		{"localhost:9715", ""},
		{"127.0.0.1", "want host:port"},
		{"127.0.0.1:0", `port "0"`},
		{"127.0.0.1:70000", `port "70000"`},
		{"127.0.0.1:-1", `port "-1"`},
		{"127.0.0.1:http", `port "http"`},
		{"", "want host:port"},
	}
	for _, tc := range cases {
		t.Run(tc.addr, func(t *testing.T) {
			err := metrics.ValidateAddress(tc.addr)
			if tc.wantErr == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.wantErr)
		})
	}
}
