package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
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
)

// lostClasses are the classes of TestNodeLost: "state" and "strict", each
// of one slot.
var lostClasses = []string{"state", "strict"}

// lostPluginConfig is the plugin block of TestNodeLost's nodes: both
// classes, restore = "required", one backup_dir. With hostPIDs, the exec
// driver runs tasks in the host's PID namespace, so that the PID a task
// writes is one the test can signal.
func lostPluginConfig(parent, backups string, hostPIDs bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    reserve_timeout    = "1m"
    backup_dir         = %q
`, parent, backups)
	for _, class := range lostClasses {
		fmt.Fprintf(&b, `    class %q {
      slots   = 1
      quota   = "32M"
      restore = "required"
    }
`, class)
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
// as start=, with the dataset's host path and ZFS_<CLASS>_RESTORED_AT, and
// then appends the next count every lostTick seconds until it is stopped.
// It writes its PID to the file pid in the dataset first.
func counterJob(class string) nomadtest.JobSpec {
	env := "ZFS_" + strings.ToUpper(class)
	return nomadtest.JobSpec{ID: "count-" + class, Type: "service", Tasks: []nomadtest.TaskSpec{{
		Name: "c", KillTimeout: "2s", Device: "zfs/dataset/" + class,
		Script: fmt.Sprintf(`d="$%[1]s_PATH"
echo "host_path=$%[1]s_HOST_PATH"
echo "restored_at=$%[1]s_RESTORED_AT"
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

// counterOut is what a counterJob task printed before it began counting.
type counterOut struct {
	hostPath   string
	restoredAt string
	start      int
}

// readCounterOut waits until alloc's task has printed its start line, and
// parses what it printed.
func readCounterOut(t *testing.T, agent *nomadtest.Agent, alloc *api.Allocation) counterOut {
	t.Helper()
	var out counterOut
	agent.Wait(t, "the start line of alloc "+alloc.ID[:8], holdTimeout, func() (bool, string) {
		stdout, err := agent.TaskLog(alloc, "c", "stdout")
		if err != nil {
			return false, err.Error()
		}
		kv := map[string]string{}
		for _, line := range strings.Split(stdout, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				kv[k] = v
			}
		}
		start, ok := kv["start"]
		if !ok {
			return false, fmt.Sprintf("stdout %q", stdout)
		}
		n, err := strconv.Atoi(start)
		if err != nil {
			return false, fmt.Sprintf("start=%q: %v", start, err)
		}
		out = counterOut{hostPath: kv["host_path"], restoredAt: kv["restored_at"], start: n}
		return true, ""
	})
	return out
}

// lastCount reads the last whole line of counter.log under dir (0 when
// there is none).
func lastCount(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "counter.log"))
	if err != nil {
		return 0, err
	}
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[:i] // a line being written is not counted
	} else {
		return 0, nil
	}
	return strconv.Atoi(s[strings.LastIndexByte(s, '\n')+1:])
}

// lostNode holds what TestNodeLost needs to bring client L back after its
// loss and to end what it left running.
type lostNode struct {
	t      *testing.T
	step   func(format string, args ...any)
	opts   nomadtest.Options // L's, to restart it on the same data
	agent  *nomadtest.Agent  // L, then L restarted
	pool   *zfstest.Pool     // L's pool, and parent its parent dataset
	parent string
	// allocs are the allocations L ran, which it releases once back.
	allocs []string
	// left are what L's agent had started (the executors, the tasks)
	// when it was stopped; tasks, the processes whose PIDs the tasks
	// wrote.
	left, tasks []hostProcess
	ended       bool
}

// end restarts L on its data directory, so that its client learns that
// its allocations are lost and stops their tasks itself (and the plugin
// releases their datasets), waits for that, and then kills by PID what
// still runs of what L left. Then it collects L's allocation directories.
// Its second call does nothing.
func (l *lostNode) end(server *nomadtest.Agent) {
	t := l.t
	t.Helper()
	if l.ended {
		return
	}
	l.ended = true
	defer l.killLeft()
	// The restarted agent writes a new agent.log: keep the lost one's.
	must.NoError(t, os.Rename(l.agent.LogPath, filepath.Join(l.opts.Dir, "agent.lost.log")))
	nodeID := l.agent.NodeID
	l.agent = nomadtest.StartAgent(t, l.opts)
	must.EqOp(t, nodeID, l.agent.NodeID, must.Sprint("the restarted client is the same node"))
	l.step("client L back (pid %d); its lost allocations' tasks stop", l.agent.PID)
	server.Wait(t, "the restarted client L to stop the tasks it left running", lostEndTimeout, func() (bool, string) {
		var running []int
		for _, p := range l.tasks {
			if p.running() {
				running = append(running, p.pid)
			}
		}
		return len(running) == 0, fmt.Sprintf("tasks still running: %v", running)
	})
	l.step("client L stopped its lost tasks")
	server.Wait(t, "client L's plugin to release the lost allocations' datasets", releaseTimeout, func() (bool, string) {
		for _, id := range l.allocs {
			if archivedFor(t, l.pool, l.parent+"/.archive", id) == "" {
				return false, "not archived yet: " + id
			}
		}
		return true, ""
	})
	l.step("client L's plugin released the lost allocations' datasets")
	// A client-only agent leaves its ended allocations' directories (and
	// mounts): collect them. (The GC call answers with an empty body,
	// which the API's decoder reports as EOF: the wait checks the effect.)
	_ = l.agent.API.Nodes().GC(l.agent.NodeID, nil)
	allocDir := filepath.Join(l.opts.Dir, "data", "alloc")
	server.Wait(t, "client L's allocation directories collected", holdTimeout, func() (bool, string) {
		left, err := os.ReadDir(allocDir)
		return err == nil && len(left) == 0, fmt.Sprintf("%d left (%v)", len(left), err)
	})
}

// killLeft kills by PID the tasks, then whatever else L's first agent had
// started, that still run, and says so: once L is back, nothing of them
// should.
func (l *lostNode) killLeft() {
	for _, p := range append(append([]hostProcess(nil), l.tasks...), l.left...) {
		if p.running() {
			l.t.Logf("killing pid %d, left running by the lost client L", p.pid)
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// hostProcess is a process by its PID and its start time (in clock ticks
// since boot), so that a PID taken again by another process is not it.
type hostProcess struct {
	pid   int
	start string
}

// hostProcessOf reads pid's start time; ok is false when there is no
// such process, or it is a zombie.
func hostProcessOf(pid int) (hostProcess, bool) {
	_, f, err := localagent.ProcStat(filepath.Join("/proc", strconv.Itoa(pid)))
	// After the name: state (field 3), ..., starttime (field 22).
	if err != nil || len(f) < 20 || f[0] == "Z" {
		return hostProcess{}, false
	}
	return hostProcess{pid: pid, start: f[19]}, true
}

// running reports whether the process still runs (a zombie runs nothing).
func (p hostProcess) running() bool {
	now, ok := hostProcessOf(p.pid)
	return ok && now == p
}

// TestNodeLost: a node lost while its task writes. One cluster: a dev
// agent S (server, and a client on its own pool) and a client-only agent
// L (another pool), the plugin on both, one backup_dir. With S ineligible,
// a job per class places its counting task on L. L's agent stops (its
// plugin with it) while the tasks go on counting: the server marks L
// down, the allocations lost, and places replacements on S. Then L comes
// back on its data and stops the tasks it had left running.
func TestNodeLost(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts Nomad agents, loses one, and runs jobs")
	step := hostStepper(t)
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
	for _, class := range lostClasses {
		jobs[class] = server.RegisterJob(t, counterJob(class).HCL())
	}
	for _, class := range lostClasses {
		firsts[class] = server.WaitForAlloc(t, jobs[class], "running", jobTimeout, func(a *api.Allocation) bool {
			return a.ClientStatus == api.AllocClientStatusRunning
		})
		must.EqOp(t, l.agent.NodeID, firsts[class].NodeID, must.Sprintf("job %s placed on L", jobs[class].ID))
		outs[class] = readCounterOut(t, l.agent, firsts[class])
		must.EqOp(t, 0, outs[class].start, must.Sprintf("class %s: a first run starts empty", class))
		must.NotEq(t, "", outs[class].hostPath)
		var task hostProcess
		server.Wait(t, "the PID of the task of class "+class, holdTimeout, func() (bool, string) {
			b, err := os.ReadFile(filepath.Join(outs[class].hostPath, "pid"))
			if err != nil {
				return false, err.Error()
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return false, err.Error()
			}
			p, ok := hostProcessOf(pid)
			task = p
			return ok, fmt.Sprintf("no process %d", pid)
		})
		l.tasks = append(l.tasks, task)
		l.allocs = append(l.allocs, firsts[class].ID)
		step("class %s: alloc %s counts on L in %s, pid %d", class, firsts[class].ID[:8], outs[class].hostPath, task.pid)
	}

	// 3. L is lost: its agent stops, its tasks go on counting.
	t.Cleanup(func() { l.end(server) })
	counts := map[string]int{}
	for _, class := range lostClasses {
		counts[class], err = lastCount(outs[class].hostPath)
		must.NoError(t, err)
	}
	_, err = server.API.Nodes().ToggleEligibility(server.NodeID, true, nil)
	must.NoError(t, err)
	plugin := hostPluginPIDs(t, l.agent.PID, pluginBin)
	must.SliceLen(t, 1, plugin, must.Sprint("L's plugin process"))
	left, err := l.agent.Abandon()
	must.NoError(t, err)
	for _, pid := range left {
		if p, ok := hostProcessOf(pid); ok {
			l.left = append(l.left, p)
		}
	}
	must.False(t, hostRunning(plugin[0]), must.Sprintf("L's plugin (pid %d) stops with its agent", plugin[0]))
	step("client L's agent stopped, its plugin (pid %d) with it; %d processes it started left running", plugin[0], len(l.left))
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
		counts[class] = n
	}

	// The replacements, on S.
	for _, class := range lostClasses {
		var repl *api.Allocation
		server.Wait(t, "the replacement of job "+jobs[class].ID+" running on S", lostTimeout+jobTimeout, func() (bool, string) {
			stubs, _, err := server.API.Jobs().Allocations(jobs[class].ID, true, nil)
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			for _, s := range stubs {
				seen = append(seen, fmt.Sprintf("%s on %s %s", s.ID[:8], s.NodeID[:8], s.ClientStatus))
				if s.ID == firsts[class].ID || s.NodeID != server.NodeID {
					continue
				}
				if s.ClientStatus == api.AllocClientStatusRunning {
					repl, _, err = server.API.Allocations().Info(s.ID, nil)
					return err == nil, fmt.Sprint(err)
				}
			}
			return false, strings.Join(seen, ", ")
		})
		first, _, err := server.API.Allocations().Info(firsts[class].ID, nil)
		must.NoError(t, err)
		must.EqOp(t, api.AllocClientStatusLost, first.ClientStatus, must.Sprintf("class %s: L's allocation", class))
		out := readCounterOut(t, server, repl)
		step("class %s: replacement %s runs on S: start=%d restored_at=%q", class, repl.ID[:8], out.start, out.restoredAt)
		// Without live backups nothing of the lost tenancy was sent: the
		// replacement starts empty.
		must.EqOp(t, 0, out.start)
		must.EqOp(t, "", out.restoredAt)
	}

	// 6. L comes back and stops what it left; the jobs stop.
	l.end(server)
	for _, class := range lostClasses {
		server.StopJob(t, jobs[class].ID, releaseTimeout)
	}
}
