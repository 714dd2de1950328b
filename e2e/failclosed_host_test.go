package e2e

import (
	"errors"
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

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// The host fail-closed tests put the fault on the host side of a slot: a
// zfs child that could outlive a killed plugin, a slot unmounted behind
// the plugin's back, a setuid-root binary a root task leaves in its slot
// (failclosed_setuid_test.go).

const (
	// hostNobody is the UID and GID of user nobody.
	hostNobody = 65534
	// hostDeathTimeout bounds the wait for a killed plugin's zfs child
	// to be gone: the kernel sends the parent-death signal at once.
	hostDeathTimeout = 5 * time.Second
)

// hostPluginConfig is the plugin block of these tests: short periods, a
// short reserve_timeout, and the given class blocks.
func hostPluginConfig(parent, classes string) string {
	return fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "5s"
    reserve_timeout    = "10s"
%s
  }
}
`, parent, classes)
}

// hostProc is what /proc/<pid>/stat says of a process.
type hostProc struct {
	state      byte // R, S, Z, ...
	ppid, pgrp int
}

// hostStat reads /proc/<pid>/stat; an error wraps fs.ErrNotExist when the
// process is gone (and reaped).
func hostStat(pid int) (hostProc, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return hostProc{}, err
	}
	// The command name in parentheses may hold spaces: the fields after
	// the last ')' are state, ppid, pgrp, ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return hostProc{}, fmt.Errorf("/proc/%d/stat: no ')': %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return hostProc{}, fmt.Errorf("/proc/%d/stat: %d fields after the name: %q", pid, len(f), s)
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	if err := errors.Join(err1, err2); err != nil {
		return hostProc{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return hostProc{state: f[0][0], ppid: ppid, pgrp: pgrp}, nil
}

// hostRunning reports whether pid is a process that can still run (a
// zombie runs nothing).
func hostRunning(pid int) bool {
	p, err := hostStat(pid)
	return err == nil && p.state != 'Z'
}

// hostPIDs lists the PIDs in /proc.
func hostPIDs(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// hostGroupMembers lists the running processes of process group pgid.
func hostGroupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	var out []int
	for _, pid := range hostPIDs(t) {
		if p, err := hostStat(pid); err == nil && p.pgrp == pgid && p.state != 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

// hostPluginPIDs lists the running plugin processes the agent launched:
// children of the agent whose executable is bin.
func hostPluginPIDs(t *testing.T, agentPID int, bin string) []int {
	t.Helper()
	var out []int
	for _, pid := range hostPIDs(t) {
		p, err := hostStat(pid)
		if err != nil || p.ppid != agentPID || p.state == 'Z' {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == bin {
			out = append(out, pid)
		}
	}
	return out
}

// hostWaitPlugin waits until the agent runs exactly one plugin process
// other than not (0: any), and returns its PID.
func hostWaitPlugin(t *testing.T, agent *nomadtest.Agent, bin string, not int, timeout time.Duration) int {
	t.Helper()
	var pid int
	agent.Wait(t, "the plugin process", timeout, func() (bool, string) {
		pids := hostPluginPIDs(t, agent.PID, bin)
		if len(pids) != 1 || pids[0] == not {
			return false, fmt.Sprintf("plugin processes of agent %d: %v (not %d)", agent.PID, pids, not)
		}
		pid = pids[0]
		return true, ""
	})
	return pid
}

// hostPausedPIDs lists the running wrapper processes paused in zfs sub
// (the wrapper leaves a marker named after its PID, which is the PID its
// caller started: the wrapper execs the real zfs).
func hostPausedPIDs(t *testing.T, w *zfstest.Wrapper, sub string) []int {
	t.Helper()
	prefix := filepath.Join(w.ControlDir, "paused.zfs."+sub+".")
	markers, err := filepath.Glob(prefix + "*")
	must.NoError(t, err)
	var out []int
	for _, m := range markers {
		pid, err := strconv.Atoi(strings.TrimPrefix(m, prefix))
		if err == nil && hostRunning(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// hostWaitPausedChild waits until a zfs sub started by plugin pid is
// paused in the wrapper, and returns the wrapper's PID.
func hostWaitPausedChild(t *testing.T, agent *nomadtest.Agent, w *zfstest.Wrapper, sub string, plugin int, timeout time.Duration) int {
	t.Helper()
	var child int
	agent.Wait(t, fmt.Sprintf("a zfs %s of plugin %d paused", sub, plugin), timeout, func() (bool, string) {
		pids := hostPausedPIDs(t, w, sub)
		for _, pid := range pids {
			if p, err := hostStat(pid); err == nil && p.ppid == plugin {
				child = pid
				return true, ""
			}
		}
		return false, fmt.Sprintf("paused zfs %s: %v", sub, pids)
	})
	return child
}

// hostMount returns the host mount at path, from the kernel's table.
func hostMount(t *testing.T, path string) (hostfs.Mount, bool) {
	t.Helper()
	table, err := hostfs.ReadTable()
	must.NoError(t, err)
	return table.At(filepath.Clean(path))
}

// releaseUnmount is the zfs subcommand in which a release unmounts slot's
// dataset on this machine's ZFS (zfstest.Pool.Capabilities, probed under
// parent), and the argument that tells its run apart: the rename into the
// archive where the rename unmounts (OpenZFS: see
// zfs.Capabilities.RenameUnmounts), of slot; elsewhere `zfs set
// canmount=off`, which unmounts (the fate's `zfs set` of the same dataset
// comes before it and must not pause).
func releaseUnmount(t *testing.T, pool *zfstest.Pool, parent, slot string) (sub, arg string) {
	t.Helper()
	if pool.Capabilities(t, parent).RenameUnmounts() {
		return "rename", slot
	}
	return "set", "canmount=off"
}

// TestFailClosed_OrphanedZFSChild: the plugin is SIGKILLed while a
// release's unmount is pending (`zfs set canmount=off`; on OpenZFS the
// rename into the archive, which does the unmount: releaseUnmount). Before the fix the child lived on
// and, once it went ahead, unmounted the fresh dataset now at the slot's
// name, which nothing remounted. Now the child dies with the plugin
// (parent-death signal, own process group); Nomad relaunches the plugin,
// which finishes the release from what ZFS says; the fresh slot is
// mounted, healthy and empty. Then the free slot is unmounted by hand: the
// plugin mounts it again before a tenant gets it.
func TestFailClosed_OrphanedZFSChild(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	w := zfstest.NewWrapper(t)
	w.SetPATH(t) // before StartAgent: Nomad passes its PATH to the plugin
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	slot := parent + "/scratch/0"
	archive := parent + "/.archive"
	unmounts, unmountArg := releaseUnmount(t, pool, parent, slot)

	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir: filepath.Dir(pluginBin),
		PluginConfig: hostPluginConfig(parent, `
    class "scratch" {
      slots = 1
      quota = "32M"
    }`),
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	plugin := hostWaitPlugin(t, agent, pluginBin, 0, deviceTimeout)
	guid := pool.Prop(t, slot, "guid")
	step("agent %d up, plugin pid %d", agent.PID, plugin)

	// 1. The first tenant writes into the slot and runs until stopped.
	writer := agent.RegisterJob(t, writerJob("writer", "owner.txt").HCL())
	alloc := agent.WaitForAlloc(t, writer, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	mp := pool.Prop(t, slot, "mountpoint")
	agent.Wait(t, "owner.txt from the writer", holdTimeout, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(mp, "owner.txt"))
		return err == nil && string(b) == alloc.ID+"\n", fmt.Sprintf("%q %v", b, err)
	})
	agent.Wait(t, "the owner stamped", holdTimeout, func() (bool, string) {
		v := recordedOwner(t, pool, slot).AllocID
		return v == alloc.ID, "owner alloc ID=" + v
	})
	step("writer %s holds %s", alloc.ID[:8], slot)

	// 2. Stop it with the slot's unmount paused: the release waits in it.
	// Only the runs naming the slot pause: the relaunched plugin's probe
	// renames a mounted dataset of its own at start.
	w.PauseFor(unmounts, unmountArg)
	_, _, err := agent.API.Jobs().Deregister(writer.ID, false, nil)
	must.NoError(t, err)
	agent.WaitForAlloc(t, writer, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	child := hostWaitPausedChild(t, agent, w, unmounts, plugin, releaseTimeout)
	args := w.WaitPaused(t, unmounts, time.Second)
	must.SliceContains(t, args, slot, must.Sprintf("the paused %s: %q", unmounts, args))
	cp, err := hostStat(child)
	must.NoError(t, err)
	must.EqOp(t, child, cp.pgrp, must.Sprint("the zfs child leads its own process group"))
	step("release paused in zfs %s (pid %d, args %q)", unmounts, child, args)

	// 3. SIGKILL the plugin: its zfs child (and the child's group) must
	// not outlive it.
	must.NoError(t, syscall.Kill(plugin, syscall.SIGKILL))
	agent.Wait(t, fmt.Sprintf("the plugin's zfs child %d gone", child), hostDeathTimeout, func() (bool, string) {
		if hostRunning(child) {
			return false, fmt.Sprintf("pid %d still runs", child)
		}
		if m := hostGroupMembers(t, child); len(m) > 0 {
			return false, fmt.Sprintf("process group %d still has %v", child, m)
		}
		return true, ""
	})
	step("plugin %d killed; its zfs child %d died with it", plugin, child)

	// 4. Nomad relaunches the plugin, which resumes the release from what
	// ZFS says: its own unmount pauses too. The dataset is not offered
	// meanwhile (the slot's spare is) and its data is still there.
	plugin2 := hostWaitPlugin(t, agent, pluginBin, plugin, deviceTimeout)
	child2 := hostWaitPausedChild(t, agent, w, unmounts, plugin2, releaseTimeout)
	step("plugin relaunched as %d; its release paused in zfs %s (pid %d)", plugin2, unmounts, child2)
	must.NotEq(t, "free", stateOf(t, pool, slot))
	b, err := os.ReadFile(filepath.Join(mp, "owner.txt"))
	must.NoError(t, err, must.Sprint("the first tenant's file is still in the slot"))
	must.EqOp(t, alloc.ID+"\n", string(b))

	// 5. Lift the fault: the release completes under the first tenant's
	// identity, and the fresh slot is mounted (with nosuid,nodev), healthy
	// and stays so: nothing left over unmounts it.
	w.Resume(unmounts)
	var archived string
	agent.Wait(t, "the slot fresh again", releaseTimeout, func() (bool, string) {
		archived = archivedFor(t, pool, archive, alloc.ID)
		done, status := hostReleased(t, pool, archive, alloc.ID, parent, 0)
		g, err := pool.TryProp(servingDataset(pool, parent, 0), "guid")
		st := ""
		if archived != "" {
			st, _ = pool.TryProp(archived, "nomad-device-zfs:state")
		}
		return done && err == nil && g != guid && st == "archived", fmt.Sprintf("%s; archived state %q", status, st)
	})
	must.EqOp(t, "writer", recordedOwner(t, pool, archived).Job)
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	slot = servingDataset(pool, parent, 0)
	step("released to %s; the slot serves %s", archived, slot)
	hostAssertMounted(t, agent, pool, slot)
	checker := agent.RunJob(t, checkerJob("checker"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, checker.ClientStatus, must.Sprint("the second tenant finds the fresh slot empty"))
	must.EqOp(t, "scratch-0", checker.AllocatedResources.Tasks["c"].Devices[0].DeviceIDs[0])
	agent.Wait(t, "the checker's release", releaseTimeout, func() (bool, string) {
		return hostReleased(t, pool, archive, checker.ID, parent, 0)
	})
	dir, unmount := pool.Look(t, archived)
	b, err = os.ReadFile(filepath.Join(dir, "owner.txt"))
	must.NoError(t, err)
	must.EqOp(t, alloc.ID+"\n", string(b), must.Sprint("the archive holds the first tenant's data"))
	unmount()
	step("second tenant %s ran on the fresh slot", checker.ID[:8])

	// 6. A free slot unmounted by hand is mounted again before it is
	// offered, and the next tenant gets the mounted dataset.
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	slot = servingDataset(pool, parent, 0)
	mp = pool.Prop(t, slot, "mountpoint")
	pool.ZFS(t, "unmount", slot)
	_, mounted := hostMount(t, mp)
	must.False(t, mounted, must.Sprintf("%s unmounted by hand", mp))
	step("unmounted %s by hand", slot)
	hostAssertMounted(t, agent, pool, slot)
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	checker2 := agent.RunJob(t, checkerJob("checker-2"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, checker2.ClientStatus)
	agent.Wait(t, "the third tenant's file in the archive", releaseTimeout, func() (bool, string) {
		return hostReleased(t, pool, archive, checker2.ID, parent, 0)
	})
	step("remounted; third tenant %s ran on it", checker2.ID[:8])
}

// hostReleased reports whether the allocation's dataset is in the archive
// and slot i under parent serves a free dataset again (its spare, or one
// made in its place), with the status for the wait.
func hostReleased(t *testing.T, pool *zfstest.Pool, archive, allocID, parent string, i int) (bool, string) {
	t.Helper()
	arch := archivedFor(t, pool, archive, allocID)
	slot := servingDataset(pool, parent, i)
	state := pollState(pool, slot)
	return arch != "" && state == "free", fmt.Sprintf("archive=%q, %s state=%q", arch, slot, state)
}

// hostAssertMounted waits until the slot's dataset is mounted at its
// mountpoint in the host's mount table, with nosuid and nodev.
func hostAssertMounted(t *testing.T, agent *nomadtest.Agent, pool *zfstest.Pool, slot string) {
	t.Helper()
	agent.Wait(t, slot+" mounted with nosuid,nodev", releaseTimeout, func() (bool, string) {
		mp, err := pool.TryProp(slot, "mountpoint")
		if err != nil {
			return false, err.Error()
		}
		m, ok := hostMount(t, mp)
		if !ok {
			mounted, _ := pool.TryProp(slot, "mounted")
			return false, fmt.Sprintf("nothing mounted at %s (mounted=%s)", mp, mounted)
		}
		return m.Source == slot && m.HasOption("nosuid") && m.HasOption("nodev"),
			fmt.Sprintf("%s: %s %s", mp, m.Source, strings.Join(m.Options, ","))
	})
}
