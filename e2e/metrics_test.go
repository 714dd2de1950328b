package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/metricstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// TestMetricsEndToEnd (issue 12): with a telemetry block the plugin, run
// by a real Nomad agent, serves Prometheus metrics. While a job holds a
// slot a scrape shows the slot in use, a Reserve counted as fresh and the
// zfs commands run; once the job is stopped, a release is counted. Then
// (issue 45) a job of a class with restore on ends: once its archive is in
// backup_dir, the backup gauges show its identity, the chain of one
// stream that restores it, and the totals.
func TestMetricsEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs a job")
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	bin := devicetest.BuildPlugin(t)
	ports, err := localagent.FreeLoopbackPorts(1)
	must.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	url := "http://" + addr + "/metrics"
	backups := t.TempDir()

	a := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir: filepath.Dir(bin),
		PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "2s"
    backup_dir         = %q
    telemetry {
      prometheus_address = %q
    }
    class "scratch" {
      slots = 2
      quota = "32M"
    }
    class "state" {
      slots   = 1
      quota   = "32M"
      restore = "best-effort"
    }
  }
}
`, parent, backups, addr),
	})
	a.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)

	// scrapeUntil polls the endpoint until cond holds of a scrape.
	var last metricstest.Families
	scrapeUntil := func(what string, cond func(f metricstest.Families) (bool, string)) {
		t.Helper()
		a.Wait(t, what, releaseTimeout, func() (bool, string) {
			f, err := metricstest.Scrape(context.Background(), url)
			if err != nil {
				return false, err.Error()
			}
			last = f
			ok, status := cond(f)
			return ok, status + "; metrics:\n" + f.Describe("nomad_device_zfs_")
		})
	}
	val := func(f metricstest.Families, name string, labels map[string]string) float64 {
		v, _ := f.Value(name, labels)
		return v
	}

	scrapeUntil("both slots free", func(f metricstest.Families) (bool, string) {
		free := val(f, "nomad_device_zfs_slots", map[string]string{"class": "scratch", "state": "free"})
		return free == 2, fmt.Sprintf("%v free", free)
	})

	hold := a.RegisterJob(t, fcHoldJob("metrics-holder"))
	alloc := a.WaitForAlloc(t, hold, "running", jobTimeout, func(x *api.Allocation) bool {
		return x.ClientStatus == api.AllocClientStatusRunning
	})
	dev := deviceOf(t, alloc)
	t.Logf("alloc %s holds %s", alloc.ID[:8], dev)

	scrapeUntil("the slot in use and its Reserve counted", func(f metricstest.Families) (bool, string) {
		inUse := val(f, "nomad_device_zfs_slots", map[string]string{"class": "scratch", "state": "in_use"})
		fresh := val(f, "nomad_device_zfs_reserve_duration_seconds", map[string]string{"outcome": "fresh"})
		return inUse == 1 && fresh >= 1, fmt.Sprintf("in_use %v, fresh reserves %v", inUse, fresh)
	})
	must.EqOp(t, 1.0, val(last, "nomad_device_zfs_slots", map[string]string{"class": "scratch", "state": "free"}))
	zfsOK := val(last, "nomad_device_zfs_zfs_command_duration_seconds", map[string]string{"command": "zfs", "outcome": "ok"})
	must.Positive(t, zfsOK, must.Sprint("zfs commands counted"))
	must.Positive(t, val(last, "nomad_device_zfs_zfs_command_duration_seconds", map[string]string{"command": "zfs", "subcommand": "set"}),
		must.Sprint("the Reserve's zfs set counted"))
	_, ok := last.Value("nomad_device_zfs_slot_used_bytes", map[string]string{"class": "scratch", "device": dev})
	must.True(t, ok, must.Sprintf("used bytes of %s", dev))
	must.Positive(t, val(last, "nomad_device_zfs_pool_free_bytes", map[string]string{"pool": pool.Name}), must.Sprint("the pool's free space"))
	t.Logf("while %s is held:\n%s", dev, last.Describe("nomad_device_zfs_"))

	_, _, err = a.API.Jobs().Deregister(hold.ID, false, nil)
	must.NoError(t, err)
	scrapeUntil("the release counted and both slots free again", func(f metricstest.Families) (bool, string) {
		started := val(f, "nomad_device_zfs_releases_started_total", map[string]string{"class": "scratch"})
		done := val(f, "nomad_device_zfs_release_duration_seconds", map[string]string{"class": "scratch", "outcome": "ok"})
		free := val(f, "nomad_device_zfs_slots", map[string]string{"class": "scratch", "state": "free"})
		return started >= 1 && done >= 1 && free == 2, fmt.Sprintf("releases started %v, done %v; %v free", started, done, free)
	})
	t.Logf("after the release:\n%s", last.Describe("nomad_device_zfs_"))

	// A job of class state writes and ends; its archive goes to backup_dir.
	done := a.RunJob(t, nomadtest.JobSpec{ID: "metrics-backup", Tasks: []nomadtest.TaskSpec{{
		Name: "w", Device: "zfs/dataset/state", Script: "echo $NOMAD_ALLOC_ID > $ZFS_STATE_PATH/id.txt",
	}}}.HCL(), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, done.ClientStatus)
	ended := time.Now()
	backedUp := map[string]string{"class": "state", "identity": "default/metrics-backup/g[0]/w (state)"}
	scrapeUntil("the archive's backup in the backup gauges", func(f metricstest.Families) (bool, string) {
		n := val(f, "nomad_device_zfs_backup_chain_streams", backedUp)
		return n == 1, fmt.Sprintf("chain of %v streams", n)
	})
	chain := val(last, "nomad_device_zfs_backup_chain_bytes", backedUp)
	must.Positive(t, chain)
	must.EqOp(t, chain, val(last, "nomad_device_zfs_backup_dir_bytes", nil), must.Sprint("one identity, one stream"))
	must.EqOp(t, 1.0, val(last, "nomad_device_zfs_backup_identities", nil))
	age := val(last, "nomad_device_zfs_backup_newest_age_seconds", backedUp)
	must.LessEq(t, time.Since(ended).Seconds()+5, age, must.Sprint("released after the job ended"))
	must.GreaterEq(t, 0.0, age)
	t.Logf("after the backup:\n%s", last.Describe("nomad_device_zfs_backup"))
}
