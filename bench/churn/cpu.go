package churn

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/localagent"
)

// CPUUse is the CPU time, in seconds, that a batch's window took on the
// whole machine and in the parts that differ between device and baseline
// jobs. On a machine the churn keeps busy, CPU time is what a device job
// costs the jobs beside it.
type CPUUse struct {
	Machine float64 `json:"machine"` // every CPU, busy (not idle or iowait)
	Plugin  float64 `json:"plugin"`  // the plugin process itself
	// ZFSCommands is the plugin's reaped children: the zfs processes (and
	// the benchmark's counting wrapper in front of each).
	ZFSCommands float64 `json:"zfs_commands"`
	ZFSDaemon   float64 `json:"zfs_daemon"` // zfs-fuse; 0 on a kernel ZFS
	Agent       float64 `json:"agent"`      // the Nomad agent process
	// AgentChildren is the agent's reaped children: executors, logmon and
	// the tasks under them.
	AgentChildren float64 `json:"agent_children"`
}

// cpuSample is the cumulative CPU time of the machine and the parts at one
// moment.
type cpuSample CPUUse

// sampleCPU reads /proc for the machine, the plugin (pluginPID), the agent
// (agentPID) and the zfs-fuse daemon, when one runs.
func sampleCPU(pluginPID, agentPID int) (cpuSample, error) {
	var s cpuSample
	var err error
	if s.Machine, err = machineBusy(); err != nil {
		return s, err
	}
	if s.Plugin, s.ZFSCommands, err = procCPU(pluginPID); err != nil {
		return s, err
	}
	if s.Agent, s.AgentChildren, err = procCPU(agentPID); err != nil {
		return s, err
	}
	if pid := zfsFusePID(); pid > 0 {
		s.ZFSDaemon, _, _ = procCPU(pid)
	}
	return s, nil
}

// since returns the use from earlier to s.
func (s cpuSample) since(earlier cpuSample) *CPUUse {
	return &CPUUse{
		Machine: s.Machine - earlier.Machine, Plugin: s.Plugin - earlier.Plugin,
		ZFSCommands: s.ZFSCommands - earlier.ZFSCommands, ZFSDaemon: s.ZFSDaemon - earlier.ZFSDaemon,
		Agent: s.Agent - earlier.Agent, AgentChildren: s.AgentChildren - earlier.AgentChildren,
	}
}

// clockTicks is USER_HZ, the unit of /proc's CPU times; Linux fixes it at
// 100 on every architecture Nomad supports.
const clockTicks = 100

// machineBusy returns the machine's busy CPU seconds from /proc/stat's
// "cpu" line: every field but idle and iowait.
func machineBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: field %d of %q: %w", i+1, line, err)
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return float64(busy) / clockTicks, nil
}

// procCPU returns a process's own CPU seconds (utime+stime) and those of
// its reaped children (cutime+cstime), from /proc/<pid>/stat.
func procCPU(pid int) (own, children float64, err error) {
	_, f, err := localagent.ProcStat(fmt.Sprintf("/proc/%d", pid)) // f[0] is field 3, the state
	if err != nil {
		return 0, 0, err
	}
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the name, want at least 15", pid, len(f))
	}
	var t [4]uint64 // utime, stime, cutime, cstime: fields 14-17
	for k := range t {
		if t[k], err = strconv.ParseUint(f[11+k], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: field %d: %w", pid, 14+k, err)
		}
	}
	return float64(t[0]+t[1]) / clockTicks, float64(t[2]+t[3]) / clockTicks, nil
}

// zfsFusePID returns the PID of the running zfs-fuse daemon, or 0. It only
// reads: the daemon is stopped by whoever started it, by its PID.
func zfsFusePID() int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "zfs-fuse" {
			return pid
		}
	}
	return 0
}
