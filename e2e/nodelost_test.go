package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

const (
	// lostHeartbeat makes the server mark a silent node down within
	// about 8 s (a TTL of 2 s, its stagger of up to 2 s, a grace of 4 s)
	// instead of Nomad's 30 s.
	lostHeartbeat = "min_heartbeat_ttl = \"2s\"\nheartbeat_grace   = \"4s\""
	// lostTimeout bounds the wait for the server to mark the node down,
	// its allocations lost, and their replacements placed.
	lostTimeout = time.Minute
	// lostEndTimeout bounds the wait for the restarted client to stop the
	// tasks it left running.
	lostEndTimeout = 2 * time.Minute
	// lostTick is the task's counting period, as its script sleeps it.
	lostTick = "0.5"
	// lostLiveWait bounds each wait for two live backups: 10
	// backup_intervals (the classes' is 3 s).
	lostLiveWait = 30 * time.Second
)

// lostClasses are the classes of TestNodeLost, each of one slot, with
// live backups every 3 s: "state" takes a live backup up to 2 min old,
// "strict" none older than 1 s, so that after a node loss (seconds to be
// marked down, a replacement placed) it has none.
var lostClasses = []string{"state", "strict"}

// lostMaxLag are the classes' max_restore_lag.
var lostMaxLag = map[string]time.Duration{"state": 2 * time.Minute, "strict": time.Second}

// lostPluginConfig is the plugin block of TestNodeLost's nodes: both
// classes, restore = "required", one backup_dir. A restore whose newest
// backup is a live one waits up to 15 s (backup.LiveSettle) for the final
// stream, then takes it: reserve_timeout covers that and the receive. With
// hostPIDs, the exec driver runs tasks in the host's PID namespace, so
// that the PID a task writes is one the test can signal.
func lostPluginConfig(parent, backups string, hostPIDs bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    reserve_timeout    = "45s"
    backup_dir         = %q
`, parent, backups)
	for _, class := range lostClasses {
		fmt.Fprintf(&b, `    class %q {
      slots           = 1
      quota           = "32M"
      restore         = "required"
      backup_interval = "3s"
      max_restore_lag = %q
    }
`, class, lostMaxLag[class])
	}
	b.WriteString("  }\n}\n")
	if hostPIDs {
		b.WriteString(`
plugin "exec" {
  config {
    default_pid_mode = "host"
  }
}
`)
	}
	return b.String()
}

// counterJob is a service job of class's dataset whose task counts: it
// finds the last count in counter.log (0 in an empty dataset), prints it
// as start=, with the dataset's host path, ZFS_<CLASS>_RESTORED_AT and the
// allocation that wrote the data last (the file writer, then its own ID),
// and then appends the next count every lostTick seconds until it is
// stopped. It writes its PID to the file pid in the dataset first.
func counterJob(class string) nomadtest.JobSpec {
	env := "ZFS_" + strings.ToUpper(class)
	return nomadtest.JobSpec{ID: "count-" + class, Type: "service", Tasks: []nomadtest.TaskSpec{{
		Name: "c", KillTimeout: "2s", Device: "zfs/dataset/" + class,
		Script: fmt.Sprintf(`d="$%[1]s_PATH"
echo "host_path=$%[1]s_HOST_PATH"
echo "restored_at=$%[1]s_RESTORED_AT"
echo "writer_before=$(cat "$d/writer" 2>/dev/null)"
echo "$NOMAD_ALLOC_ID" > "$d/writer"
n=0
if [ -e "$d/counter.log" ]; then
  while read -r c; do n=$c; done < "$d/counter.log"
fi
echo "start=$n"
echo $$ > "$d/pid"
while true; do
  n=$((n + 1))
  echo "$n" >> "$d/counter.log"
  sleep %[2]s
done
`, env, lostTick),
	}}}
}

// TestNodeLost: a node lost while its task writes. One cluster: a dev
// agent S (server, and a client on its own pool) and a client-only agent
// L (another pool), the plugin on both, one backup_dir. With S ineligible,
// a job per class places its counting task on L, and L's plugin sends live
// backups of their datasets. L's agent stops (its plugin with it) while
// the tasks go on counting: the server marks L down, the allocations
// lost, and places replacements on S. Class "state"'s starts with the last
// live backup (a count at least the one read before it was taken), and
// ZFS_STATE_RESTORED_AT says when that was taken, within max_restore_lag
// of its start; class "strict"'s does not start on data older than its
// max_restore_lag of 1 s, and its events say so. Then the jobs stop, and L
// comes back on its data, stops the tasks it had left running, and
// releases their datasets, after the replacement's release: the data of
// class state forked. Its job run again is refused, naming both forks,
// until the operator sets the lost allocation's aside (backups
// set-aside); then it starts on the replacement's data.
func TestNodeLost(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents, loses one, and runs jobs")
	step := stepper(t)
	backups := filepath.Join(t.TempDir(), "backups")
	must.NoError(t, os.Mkdir(backups, 0o700))
	pluginBin := devicetest.BuildPlugin(t)
	newParent := func() (*zfstest.Pool, string) {
		pool := zfstest.NewPool(t, 0)
		parent := pool.Dataset("nomad")
		pool.ZFS(t, "create", parent)
		return pool, parent
	}
	waitDevices := func(agent *nomadtest.Agent) {
		for _, class := range lostClasses {
			agent.WaitForDevice(t, "zfs", "dataset", class, 1, deviceTimeout)
		}
	}

	_, parentS := newParent()
	server := nomadtest.StartAgent(t, nomadtest.Options{PluginDir: filepath.Dir(pluginBin),
		PluginConfig: lostPluginConfig(parentS, backups, false), ServerConfig: lostHeartbeat})
	waitDevices(server)
	_, err := server.API.Nodes().ToggleEligibility(server.NodeID, false, nil)
	must.NoError(t, err)
	step("client S (and the server): node %s at %s, ineligible", server.NodeID[:8], server.Addr)
	l := &lostNode{t: t, step: step}
	l.pool, l.parent = newParent()
	l.opts = nomadtest.Options{Join: server.RPCAddr, Dir: t.TempDir(),
		PluginDir: filepath.Dir(pluginBin), PluginConfig: lostPluginConfig(l.parent, backups, true)}
	l.agent = nomadtest.StartAgent(t, l.opts)
	waitDevices(l.agent)
	step("client L: node %s at %s", l.agent.NodeID[:8], l.agent.Addr)

	// 1. Each class's counting task runs on L.
	jobs := map[string]nomadtest.Job{}
	firsts := map[string]*api.Allocation{}
	outs := map[string]counterOut{}
	t.Cleanup(func() { l.end(server) })
	for _, class := range lostClasses {
		jobs[class] = server.RegisterJob(t, counterJob(class).HCL())
		l.jobs = append(l.jobs, jobs[class].ID)
	}
	for _, class := range lostClasses {
		firsts[class] = server.WaitForAlloc(t, jobs[class], "running", jobTimeout, func(a *api.Allocation) bool {
			return a.ClientStatus == api.AllocClientStatusRunning
		})
		must.EqOp(t, l.agent.NodeID, firsts[class].NodeID, must.Sprintf("job %s placed on L", jobs[class].ID))
		outs[class] = readCounterOut(t, l.agent, firsts[class])
		must.EqOp(t, 0, outs[class].start, must.Sprintf("class %s: a first run starts empty", class))
		must.EqOp(t, "", outs[class].restoredAt, must.Sprintf("class %s: nothing restored", class))
		must.NotEq(t, "", outs[class].hostPath)
		task := l.waitTask(server, outs[class].hostPath)
		l.allocs = append(l.allocs, firsts[class].ID)
		step("class %s: alloc %s counts on L in %s, pid %d", class, firsts[class].ID[:8], outs[class].hostPath, task.pid)
	}

	// 2. Live backups while the tasks count. Of two live backups stamped
	// (released_at) after a count was read, the second was taken after the
	// first was sent, so after the read, whenever in its pass the plugin
	// stamps it: it holds that count or a later one.
	for _, class := range lostClasses {
		server.Wait(t, "two live backups of class "+class, lostLiveWait, func() (bool, string) {
			_, live, err := allocManifests(backups, firsts[class].ID)
			return err == nil && live >= 2, fmt.Sprintf("%d live manifests (%v)", live, err)
		})
	}
	readAt := time.Now()
	counted, err := lastCount(outs["state"].hostPath)
	must.NoError(t, err)
	server.Wait(t, "two live backups of class state stamped after its count was read", lostLiveWait, func() (bool, string) {
		ms, _, err := allocManifests(backups, firsts["state"].ID)
		after := 0
		for _, m := range ms {
			if m.Live && m.ReleasedAt.After(readAt) {
				after++
			}
		}
		return err == nil && after >= 2, fmt.Sprintf("%d of %d (%v)", after, len(ms), err)
	})
	step("class state: count %d read at %s, two live backups since", counted, readAt.UTC().Format(time.RFC3339Nano))

	// 3. L is lost: its agent stops, its tasks go on counting.
	counts := map[string]int{}
	for _, class := range lostClasses {
		counts[class], err = lastCount(outs[class].hostPath)
		must.NoError(t, err)
	}
	_, err = server.API.Nodes().ToggleEligibility(server.NodeID, true, nil)
	must.NoError(t, err)
	plugin := hostPluginPIDs(t, l.agent.PID, pluginBin)
	must.SliceLen(t, 1, plugin, must.Sprint("L's plugin process"))
	l.abandon()
	must.False(t, hostRunning(plugin[0]), must.Sprintf("L's plugin (pid %d) stops with its agent", plugin[0]))
	step("client L's agent stopped, its plugin (pid %d) with it; %d processes it started left running", plugin[0], len(l.left))
	// Nothing sends backups of L's allocations any more: the newest is
	// the last increment.
	lastLive := map[string]backupManifest{}
	for _, class := range lostClasses {
		ms, live, err := allocManifests(backups, firsts[class].ID)
		must.NoError(t, err)
		must.Positive(t, live)
		must.True(t, ms[0].Live, must.Sprintf("class %s: the newest backup of a running task is a live one: %+v", class, ms))
		lastLive[class] = ms[0]
		step("class %s: %d live backups of alloc %s, the last taken at %s (%s)", class, live, firsts[class].ID[:8],
			ms[0].ReleasedAt.UTC().Format(time.RFC3339Nano), ms[0].path)
	}
	server.Wait(t, "the server to mark L down", lostTimeout, func() (bool, string) {
		node, _, err := server.API.Nodes().Info(l.agent.NodeID, nil)
		if err != nil {
			return false, err.Error()
		}
		return node.Status == api.NodeStatusDown, "L is " + node.Status
	})
	step("L is down")
	for _, class := range lostClasses {
		n, err := lastCount(outs[class].hostPath)
		must.NoError(t, err)
		must.Greater(t, counts[class], n, must.Sprintf("class %s: the lost node's task goes on writing", class))
		// The server marks the node down, then its allocations lost: a
		// moment apart (seen in the OpenZFS VM).
		server.Wait(t, fmt.Sprintf("class %s: L's allocation lost", class), lostTimeout, func() (bool, string) {
			first, _, err := server.API.Allocations().Info(firsts[class].ID, nil)
			if err != nil {
				return false, err.Error()
			}
			return first.ClientStatus == api.AllocClientStatusLost, "client status " + first.ClientStatus
		})
	}

	// 4. Class state's replacement on S starts with the last increment.
	repl := waitReplacement(t, server, jobs["state"], server.NodeID, api.AllocClientStatusRunning)
	out := readCounterOut(t, server, repl)
	step("class state: replacement %s runs on S: start=%d restored_at=%q", repl.ID[:8], out.start, out.restoredAt)
	must.GreaterEq(t, counted, out.start, must.Sprint("the replacement starts with a count at least the one in the last live backup"))
	restoredAt, err := time.Parse(time.RFC3339, out.restoredAt)
	must.NoError(t, err, must.Sprint("ZFS_STATE_RESTORED_AT is an RFC 3339 time"))
	must.Eq(t, lastLive["state"].ReleasedAt.UTC().Truncate(time.Second), restoredAt,
		must.Sprintf("ZFS_STATE_RESTORED_AT is the time of the last live backup, %s", lastLive["state"].path))
	started := repl.TaskStates["c"].StartedAt
	must.True(t, !started.Before(restoredAt) && started.Sub(restoredAt) <= lostMaxLag["state"],
		must.Sprintf("the task started at %s on data of %s: within max_restore_lag = %s", started, restoredAt, lostMaxLag["state"]))
	step("class state: started %s after its data was taken", started.Sub(restoredAt).Round(time.Second))
	must.EqOp(t, firsts["state"].ID, out.writerBefore, must.Sprint("the replacement's data is the lost allocation's"))

	// 5. Class strict's replacement does not start on data older than
	// its max_restore_lag.
	failed := waitReplacement(t, server, jobs["strict"], server.NodeID, api.AllocClientStatusFailed)
	events := nomadtest.DescribeTaskStates(failed)
	must.StrContains(t, events, "older than max_restore_lag")
	must.StrContains(t, events, filepath.Base(lastLive["strict"].path))
	step("class strict: replacement %s failed: %s", failed.ID[:8], events)

	// 6. The jobs stop: the replacement's release is sent. Then L comes
	// back, stops what it left and releases it: the lost allocation's
	// final stream is class state's newest by time, of data its
	// replacement restored an earlier state of and ran on. The data forked.
	for _, class := range lostClasses {
		server.StopJob(t, jobs[class].ID, releaseTimeout)
	}
	server.Wait(t, "the replacement's release in backup_dir", releaseTimeout, func() (bool, string) {
		ms, live, err := allocManifests(backups, repl.ID)
		return err == nil && len(ms) > live, fmt.Sprintf("%d manifests, %d live (%v)", len(ms), live, err)
	})
	l.end(server)
	server.Wait(t, "the lost allocation's late release in backup_dir", releaseTimeout, func() (bool, string) {
		ms, live, err := allocManifests(backups, firsts["state"].ID)
		return err == nil && len(ms) > live, fmt.Sprintf("%d manifests, %d live (%v)", len(ms), live, err)
	})
	_, err = server.API.Nodes().ToggleEligibility(l.agent.NodeID, false, nil)
	must.NoError(t, err)
	cfgFile := filepath.Join(t.TempDir(), "client.hcl")
	must.NoError(t, os.WriteFile(cfgFile, []byte(lostPluginConfig(parentS, backups, false)), 0o600))
	verify := runCLI(t, pluginBin, nil, "backups", "verify", "-config", cfgFile)
	must.EqOp(t, 1, verify.code, must.Sprint(verify.stdout, verify.stderr))
	must.StrContains(t, verify.stdout, "FORKED with "+repl.ID)
	step("class state: L released %s after its replacement %s: the data forked (backups verify: FORKED)", firsts["state"].ID[:8], repl.ID[:8])

	// 7. The job again, on S: refused, naming both forks.
	seen := jobAllocs(t, server, jobs["state"].ID)
	jobs["state"] = server.RegisterJob(t, counterJob("state").HCL())
	refused := waitAllocOn(t, server, jobs["state"], server.NodeID, seen, api.AllocClientStatusFailed)
	events = nomadtest.DescribeTaskStates(refused)
	for _, s := range []string{"forked", firsts["state"].ID, repl.ID} {
		must.StrContains(t, events, s)
	}
	step("class state: %s refused: %s", refused.ID[:8], events)
	server.StopJob(t, jobs["state"].ID, releaseTimeout)
	// Purged, so that the next registration places anew rather than
	// reschedule the failed allocation after its delay.
	_, _, err = server.API.Jobs().Deregister(jobs["state"].ID, true, nil)
	must.NoError(t, err)

	// 8. The operator sets the lost allocation's fork aside: the job
	// starts on its replacement's data.
	aside := runCLI(t, pluginBin, nil, "backups", "set-aside", "-config", cfgFile, "-alloc", firsts["state"].ID)
	must.EqOp(t, 0, aside.code, must.Sprint(aside.stdout, aside.stderr))
	seen = jobAllocs(t, server, jobs["state"].ID)
	jobs["state"] = server.RegisterJob(t, counterJob("state").HCL())
	third := waitAllocOn(t, server, jobs["state"], server.NodeID, seen, api.AllocClientStatusRunning)
	out = readCounterOut(t, server, third)
	must.EqOp(t, repl.ID, out.writerBefore, must.Sprint("the data is the replacement's"))
	step("class state: after backups set-aside, %s starts on %s's data: start=%d", third.ID[:8], repl.ID[:8], out.start)
	server.StopJob(t, jobs["state"].ID, releaseTimeout)
}

// jobAllocs returns the IDs of every allocation of jobID so far.
func jobAllocs(t *testing.T, server *nomadtest.Agent, jobID string) map[string]bool {
	t.Helper()
	stubs, _, err := server.API.Jobs().Allocations(jobID, true, nil)
	must.NoError(t, err)
	out := map[string]bool{}
	for _, s := range stubs {
		out[s.ID] = true
	}
	return out
}

// waitReplacement waits until the allocation of job on node nodeID (a
// replacement: none of the job's ran there before) reaches client status
// want, and returns it. It fails the test, logging the allocation, when
// that reaches another terminal status.
func waitReplacement(t *testing.T, server *nomadtest.Agent, job nomadtest.Job, nodeID, want string) *api.Allocation {
	t.Helper()
	return waitAllocOn(t, server, job, nodeID, nil, want)
}

// waitAllocOn is waitReplacement of an allocation not in skip.
func waitAllocOn(t *testing.T, server *nomadtest.Agent, job nomadtest.Job, nodeID string, skip map[string]bool, want string) *api.Allocation {
	t.Helper()
	var repl *api.Allocation
	server.Wait(t, fmt.Sprintf("the replacement of job %s on node %s to be %s", job.ID, nodeID[:8], want), lostTimeout+jobTimeout, func() (bool, string) {
		stubs, _, err := server.API.Jobs().Allocations(job.ID, true, nil)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, s := range stubs {
			seen = append(seen, fmt.Sprintf("%s on %s %s", s.ID[:8], s.NodeID[:8], s.ClientStatus))
			if s.NodeID != nodeID || skip[s.ID] {
				continue
			}
			if repl, _, err = server.API.Allocations().Info(s.ID, nil); err != nil {
				return false, err.Error()
			}
			return repl.ClientStatus == want || repl.ClientTerminalStatus(), nomadtest.DescribeTaskStates(repl)
		}
		return false, strings.Join(seen, ", ")
	})
	if repl.ClientStatus != want {
		server.LogAlloc(t, repl)
		t.Fatalf("the replacement %s of job %s is %s, not %s", repl.ID, job.ID, repl.ClientStatus, want)
	}
	return repl
}
