package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// TestNodeLost's parts: what its counting tasks print and write, the lost
// client L and what it leaves running, and backup_dir's manifests.

// counterOut is what a counterJob task printed before it began counting.
type counterOut struct {
	hostPath   string
	restoredAt string
	start      int
	// writerBefore is the allocation that wrote the data last before this
	// one ("" for none): the file writer in the dataset, read at start.
	writerBefore string
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
		out = counterOut{hostPath: kv["host_path"], restoredAt: kv["restored_at"], start: n, writerBefore: kv["writer_before"]}
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
	// jobs are the test's jobs; allocs, the allocations L ran, which it
	// releases once back.
	jobs, allocs []string
	// left are what L's agent had started (the executors, the tasks)
	// when it was stopped; tasks, the processes whose PIDs the tasks
	// wrote.
	left, tasks []hostProcess
	ended       bool
}

// end leaves nothing of L's allocations running or mounted. After
// abandon, it restarts L on its data directory, so that its client learns
// that its allocations are lost and stops their tasks itself (and the
// plugin releases their datasets), waits for that, and then kills by PID
// what still runs of what L left. Before (a test failed early), it stops
// the jobs, which L's client and plugin end as usual. Then it collects
// L's allocation directories, which a client-only agent leaves mounted.
// Its second call does nothing.
func (l *lostNode) end(server *nomadtest.Agent) {
	t := l.t
	t.Helper()
	if l.ended {
		return
	}
	l.ended = true
	if l.agent.Exited() {
		l.restart(server)
	} else {
		for _, id := range l.jobs {
			server.StopJob(t, id, releaseTimeout)
		}
	}
	l.collect(server)
}

// collect has client L collect its allocations' directories (their
// secrets mounts with them), which must all have stopped, and waits until
// it did.
func (l *lostNode) collect(server *nomadtest.Agent) {
	t := l.t
	t.Helper()
	// (The GC call answers with an empty body, which the API's decoder
	// reports as EOF: the wait checks the effect.)
	_ = l.agent.API.Nodes().GC(l.agent.NodeID, nil)
	allocDir := filepath.Join(l.opts.Dir, "data", "alloc")
	server.Wait(t, "client L's allocation directories collected", holdTimeout, func() (bool, string) {
		left, err := os.ReadDir(allocDir)
		return err == nil && len(left) == 0, fmt.Sprintf("%d left (%v)", len(left), err)
	})
}

// restart starts L again after abandon, and waits until its client has
// stopped the tasks it left and its plugin has released their datasets;
// then it kills by PID what still runs of what L left.
func (l *lostNode) restart(server *nomadtest.Agent) {
	t := l.t
	t.Helper()
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
}

// waitTask waits until the task that counts in hostPath has written its
// PID there, and returns that process, which it adds to l.tasks.
func (l *lostNode) waitTask(server *nomadtest.Agent, hostPath string) hostProcess {
	l.t.Helper()
	var task hostProcess
	server.Wait(l.t, "the PID of the task counting in "+hostPath, holdTimeout, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(hostPath, "pid"))
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
	return task
}

// abandon stops L's agent as a lost node's (nomadtest.Agent.Abandon),
// and records what it left running.
func (l *lostNode) abandon() {
	l.t.Helper()
	left, err := l.agent.Abandon()
	must.NoError(l.t, err)
	for _, pid := range left {
		if p, ok := hostProcessOf(pid); ok {
			l.left = append(l.left, p)
		}
	}
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

// backupManifest is what TestNodeLost reads of a manifest in backup_dir:
// the fields docs/operations.md's restore by hand reads too.
type backupManifest struct {
	AllocID    string    `json:"alloc_id"`
	Live       bool      `json:"live"`
	ReleasedAt time.Time `json:"released_at"`
	path       string
}

// allocManifests reads the manifests in backups of allocation allocID,
// newest (by released_at) first; live counts its live ones.
func allocManifests(backups, allocID string) (ms []backupManifest, live int, err error) {
	paths, err := filepath.Glob(filepath.Join(backups, "nomad-device-zfs", "*", "*.json"))
	if err != nil {
		return nil, 0, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned since the glob
		}
		if err != nil {
			return nil, 0, err
		}
		var m backupManifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, 0, fmt.Errorf("manifest %s: %w", p, err)
		}
		if m.AllocID != allocID {
			continue
		}
		m.path = p
		ms = append(ms, m)
		if m.Live {
			live++
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].ReleasedAt.After(ms[j].ReleasedAt) })
	return ms, live, nil
}
