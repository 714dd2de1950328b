package slots_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// env is one manager on a fresh pool with a parent dataset.
type env struct {
	pool   *zfstest.Pool
	runner *zfs.Runner
	mgr    *slots.Manager
	cfg    slots.Config
}

func newEnv(t *testing.T, nslots int) *env {
	t.Helper()
	return newEnvSized(t, nslots, 0)
}

// newEnvSized is newEnv on a pool of size bytes (2 GiB when 0).
func newEnvSized(t *testing.T, nslots int, size int64) *env {
	t.Helper()
	pool := zfstest.NewPool(t, size)
	pool.ZFS(t, "create", pool.Dataset("nomad"))
	e := &env{pool: pool}
	e.cfg = slots.Config{Parent: pool.Dataset("nomad"), Classes: []slots.Class{{
		Name: "scratch", Slots: nslots, Quota: 64 << 20, UID: 65534, GID: 65534, Mode: 0o770,
		Properties: map[string]string{"compression": "on"},
	}}, RenameUnmounts: pool.Capabilities(t, pool.Dataset("nomad")).RenameUnmounts()}
	e.restart(t)
	return e
}

// restart replaces the manager with a new one, as a plugin restart does.
func (e *env) restart(t *testing.T) {
	t.Helper()
	e.runner = &zfs.Runner{BusyBackoff: 100 * time.Millisecond}
	mgr := slots.NewManager(zfs.NewClient(e.runner), hclog.NewNullLogger())
	e.mgr = mgr
	e.mgr.SetConfig(e.cfg)
	// Before the pool goes: work the manager runs in the background (a
	// spare being made, a release) ends first.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := mgr.Wait(ctx); err != nil {
			t.Errorf("background slot work did not end: %v", err)
		}
	})
}

func (e *env) sync(t *testing.T) []slots.Slot {
	t.Helper()
	must.NoError(t, e.mgr.Sync(context.Background()))
	return e.mgr.Slots()
}

func (e *env) guid(t *testing.T, ds string) string {
	t.Helper()
	return e.pool.Prop(t, ds, "guid")
}

func ids(ss []slots.Slot) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func TestManager_ProvisionAndAdopt(t *testing.T) {
	e := newEnv(t, 3)
	got := e.sync(t)
	must.Eq(t, []string{"scratch-0", "scratch-1", "scratch-2"}, ids(got))
	for _, s := range got {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
		must.Eq(t, record.StateFree, s.State)
		must.Eq(t, e.pool.Dataset("nomad/scratch/")+itoa(s.Index), s.Dataset)
		must.Eq(t, "67108864", e.pool.Prop(t, s.Dataset, "refquota"))
		must.Eq(t, "off", e.pool.Prop(t, s.Dataset, "setuid"))
		must.Eq(t, "off", e.pool.Prop(t, s.Dataset, "devices"))
		must.Eq(t, "on", e.pool.Prop(t, s.Dataset, "compression"))
		must.Eq(t, "slot", e.pool.Prop(t, s.Dataset, record.PropManaged))
		fi, err := os.Stat(s.Mountpoint)
		must.NoError(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		must.Eq(t, uint32(65534), st.Uid)
		must.Eq(t, uint32(65534), st.Gid)
		must.Eq(t, os.FileMode(0o770), fi.Mode().Perm())
	}
	before := map[string]string{}
	for _, s := range got {
		before[s.Dataset] = e.guid(t, s.Dataset)
	}

	// A restart adopts what exists: same GUIDs, and only the two reads.
	e.restart(t)
	got = e.sync(t)
	must.Eq(t, int64(2), e.runner.Runs(), must.Sprint("adopting must run zpool list and one zfs get, nothing per dataset"))
	for _, s := range got {
		must.True(t, s.Healthy)
		must.Eq(t, before[s.Dataset], e.guid(t, s.Dataset))
	}
}

func TestManager_ReserveAndResize(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e := newEnv(t, 3)
	e.sync(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Without a Nomad API, a fresh slot can be handed over (it is empty),
	// but a reserved one never: nobody can prove who asks.
	res, err := e.mgr.Reserve(ctx, []string{"scratch-1"})
	must.NoError(t, err)
	short, shortCancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer shortCancel()
	_, err = e.mgr.Reserve(short, []string{"scratch-1"})
	must.ErrorContains(t, err, "cannot read allocations to verify the asker")
	// Put it back to free as an operator would, for the resize below.
	e.pool.ZFS(t, "set", record.PropState+"=free", res[0].Dataset)
	e.sync(t)

	a := newAllocs()
	e.mgr.SetNomad(a)
	a.hold("scratch-2", owner(40))

	sets, creates := w.Count("set"), w.Count("create")
	res, err = e.mgr.Reserve(ctx, []string{"scratch-2"})
	must.NoError(t, err)
	must.Eq(t, 0, w.Count("set")-sets, must.Sprint("Reserve on a fresh slot runs no zfs command (package armed)"))
	must.Eq(t, 0, w.Count("create")-creates, must.Sprint("no spare beside a handover not recorded yet"))
	// Behind it (Run's pass, here by hand), the owner is recorded (one
	// zfs set), and then the spare made in the background (one create).
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))
	must.Eq(t, 1, w.Count("set")-sets)
	must.Eq(t, 1, w.Count("create")-creates)
	must.Eq(t, e.pool.Dataset("nomad/scratch/2.alt"), slotByID(t, e, "scratch-2").Spare)
	must.SliceLen(t, 1, res)
	must.Eq(t, record.StateReserved, res[0].State)
	must.Eq(t, "reserved", stateOf(t, e, res[0].Dataset))

	// Idempotent for the owner: no command at all the second time.
	runs := e.runner.Runs()
	_, err = e.mgr.Reserve(ctx, []string{"scratch-2"})
	must.NoError(t, err)
	must.Eq(t, runs, e.runner.Runs())

	_, err = e.mgr.Reserve(ctx, []string{"scratch-9"})
	must.ErrorContains(t, err, `unknown device ID "scratch-9"`)
	must.ErrorContains(t, err, "scratch-0, scratch-1, scratch-2")

	// Lower to one slot: the free scratch-1 goes, the reserved scratch-2 stays.
	guid2 := e.guid(t, e.pool.Dataset("nomad/scratch/2"))
	e.cfg.Classes[0].Slots = 1
	e.mgr.SetConfig(e.cfg)
	got := e.sync(t)
	must.Eq(t, []string{"scratch-0", "scratch-2"}, ids(got))
	must.True(t, got[1].Surplus)
	must.False(t, got[1].Healthy)
	must.StrContains(t, got[1].HealthDesc, "beyond slots = 1")
	out, err := exec.Command("zfs", "list", "-H", "-o", "name", e.pool.Dataset("nomad/scratch/1")).CombinedOutput()
	must.Error(t, err, must.Sprintf("scratch/1 should be destroyed: %s", out))
	must.Eq(t, guid2, e.guid(t, e.pool.Dataset("nomad/scratch/2")))
	// The reserved surplus slot can still be reserved again by its owner.
	_, err = e.mgr.Reserve(ctx, []string{"scratch-2"})
	must.NoError(t, err)

	// Raise to four: 1 and 3 are created, 2 is adopted as it is.
	e.cfg.Classes[0].Slots = 4
	e.mgr.SetConfig(e.cfg)
	got = e.sync(t)
	must.Eq(t, []string{"scratch-0", "scratch-1", "scratch-2", "scratch-3"}, ids(got))
	for _, s := range got {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
	}
	must.Eq(t, guid2, e.guid(t, e.pool.Dataset("nomad/scratch/2")))
	must.Eq(t, record.StateReserved, got[2].State)
}

func TestManager_ForeignDatasetsLeftAlone(t *testing.T) {
	e := newEnv(t, 2)
	// Someone else's dataset sits where slot 1 goes, and another beside it.
	e.pool.ZFS(t, "create", e.pool.Dataset("nomad/scratch"))
	e.pool.ZFS(t, "create", e.pool.Dataset("nomad/scratch/1"))
	e.pool.ZFS(t, "create", e.pool.Dataset("nomad/mine"))
	guid := e.guid(t, e.pool.Dataset("nomad/scratch/1"))
	err := e.mgr.Sync(context.Background())
	must.NoError(t, err)
	got := e.mgr.Slots()
	for _, s := range got {
		must.False(t, s.Healthy)
		must.StrContains(t, s.HealthDesc, "is not managed by nomad-device-zfs")
	}
	must.Eq(t, guid, e.guid(t, e.pool.Dataset("nomad/scratch/1")))
	must.Eq(t, "", e.pool.Prop(t, e.pool.Dataset("nomad/scratch/1"), record.PropManaged))
	_, err = e.mgr.Reserve(context.Background(), []string{"scratch-1"})
	must.ErrorContains(t, err, "cannot be reserved")
}

func TestManager_UsageAfterWrite(t *testing.T) {
	e := newEnv(t, 1)
	got := e.sync(t)
	// Incompressible data, so that compression does not hide it.
	data := make([]byte, 4<<20)
	f, err := os.Open("/dev/urandom")
	must.NoError(t, err)
	_, err = f.Read(data)
	must.NoError(t, err)
	_ = f.Close()
	must.NoError(t, os.WriteFile(filepath.Join(got[0].Mountpoint, "blob"), data, 0o644))

	// ZFS accounts space at the next transaction group: poll, bounded.
	deadline := time.Now().Add(90 * time.Second)
	var used uint64
	for time.Now().Before(deadline) {
		must.NoError(t, e.mgr.Refresh(context.Background()))
		used = e.mgr.Slots()[0].Usage.Used
		if used >= 4<<20 {
			break
		}
		time.Sleep(time.Second)
	}
	must.GreaterEq(t, uint64(4<<20), used)
	u := e.mgr.Slots()[0].Usage
	must.Eq(t, uint64(64<<20), u.Quota)
	must.Less(t, uint64(64<<20), u.Available)
	must.GreaterEq(t, 1.0, u.CompressRatio)
}

func TestManager_RefreshIfOlderCaches(t *testing.T) {
	e := newEnv(t, 2)
	e.sync(t)
	runs := e.runner.Runs()
	for i := 0; i < 5; i++ {
		must.NoError(t, e.mgr.RefreshIfOlder(context.Background(), time.Hour))
	}
	must.Eq(t, runs, e.runner.Runs())
	must.NoError(t, e.mgr.RefreshIfOlder(context.Background(), 0))
	must.Eq(t, runs+1, e.runner.Runs())
}

func TestManager_ParentMissing(t *testing.T) {
	e := newEnv(t, 2)
	e.cfg.Parent = e.pool.Dataset("gone")
	e.mgr.SetConfig(e.cfg)
	must.NoError(t, e.mgr.Sync(context.Background()))
	got := e.mgr.Slots()
	must.SliceLen(t, 2, got)
	for _, s := range got {
		must.False(t, s.Healthy)
		must.StrContains(t, s.HealthDesc, "does not exist")
	}
	must.Eq(t, int64(2), e.runner.Runs(), must.Sprint("nothing is created when the parent is missing"))
	_, err := e.mgr.Reserve(context.Background(), []string{"scratch-0"})
	must.ErrorContains(t, err, "cannot be reserved")
}

// An exported pool is "not imported": every slot is unhealthy, nothing is
// created or destroyed, and after import the same datasets are adopted.
func TestManager_PoolUnavailable(t *testing.T) {
	e := newEnv(t, 2)
	first := e.sync(t)
	guid := e.guid(t, first[0].Dataset)
	out, err := exec.Command("zpool", "export", e.pool.Name).CombinedOutput()
	if err != nil {
		testenv.Skip(t, fmt.Sprintf("zpool export failed on this ZFS (%v: %s); cannot stage an unavailable pool", err, out))
	}
	t.Cleanup(func() { _ = exec.Command("zpool", "import", "-d", e.pool.Dir, e.pool.Name).Run() })

	runs := e.runner.Runs()
	must.NoError(t, e.mgr.Sync(context.Background()))
	must.Eq(t, runs+1, e.runner.Runs(), must.Sprint("only the pool check runs"))
	for _, s := range e.mgr.Slots() {
		must.False(t, s.Healthy)
		must.StrContains(t, s.HealthDesc, "is not imported")
		must.NotEq(t, "", s.Mountpoint, must.Sprint("what was known is kept"))
	}

	out, err = exec.Command("zpool", "import", "-d", e.pool.Dir, e.pool.Name).CombinedOutput()
	must.NoError(t, err, must.Sprintf("%s", out))
	got := e.sync(t)
	for _, s := range got {
		must.True(t, s.Healthy, must.Sprintf("%s: %s", s.ID, s.HealthDesc))
	}
	must.Eq(t, guid, e.guid(t, got[0].Dataset))
}

func itoa(i int) string { return string(rune('0' + i)) }

// startHolder starts a process whose working directory is dir and stops it
// (by its PID) at cleanup.
func startHolder(t *testing.T, dir string) *os.Process {
	t.Helper()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "120"}, &os.ProcAttr{Dir: dir})
	must.NoError(t, err)
	t.Cleanup(func() { _ = p.Kill(); _, _ = p.Wait() })
	return p
}

// reserveResult is what a Reserve returned.
type reserveResult struct {
	res []slots.Slot
	err error
}

// goReserve calls Reserve of ids in a goroutine of its own; its outcome
// comes on the channel returned.
func goReserve(ctx context.Context, e *env, ids ...string) <-chan reserveResult {
	got := make(chan reserveResult, 1)
	go func() {
		res, err := e.mgr.Reserve(ctx, ids)
		got <- reserveResult{res, err}
	}()
	return got
}
