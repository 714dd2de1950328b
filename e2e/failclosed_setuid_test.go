package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
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

// The setuid test: a setuid-root binary that a root task leaves in its slot
// grants nothing to a host user or to the task itself, because every slot
// mount carries nosuid and nodev (unless the class asks for setuid = "on").

// hostEUIDAsNobody runs `bin -u` (a copy of id(1), which prints the
// effective UID) as user nobody and returns the UID it printed.
func hostEUIDAsNobody(t *testing.T, bin string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: hostNobody, Gid: hostNobody, Groups: []uint32{}}}
	out, err := cmd.Output()
	must.NoError(t, err, must.Sprintf("running %s as nobody", bin))
	euid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	must.NoError(t, err, must.Sprintf("output of %s: %q", bin, out))
	return euid
}

// hostSetuidCopy copies src into dir as a setuid-root binary and returns
// its path.
func hostSetuidCopy(t *testing.T, src, dir string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	must.NoError(t, err)
	bin := filepath.Join(dir, "id")
	must.NoError(t, os.WriteFile(bin, b, 0o755))
	must.NoError(t, os.Chown(bin, 0, 0))
	must.NoError(t, os.Chmod(bin, os.ModeSetuid|0o755))
	fi, err := os.Stat(bin)
	must.NoError(t, err)
	must.True(t, fi.Mode()&os.ModeSetuid != 0, must.Sprintf("%s kept the setuid bit", bin))
	return bin
}

// hostRootJob is the tenant that plants the binary: a root task (raw_exec
// runs as the agent's user, root) copies id(1) into its dataset, through
// the host path the plugin gives it, as a setuid-root binary, and holds
// the slot until the test drops release-me. (The exec driver cannot run a
// root task on a host whose capability bounding set lacks one of Nomad's
// legacy root capabilities, as in containers without CAP_SYS_RESOURCE;
// raw_exec writes the same file into the same dataset.)
var hostRootJob = nomadtest.JobSpec{ID: "suid-root", Tasks: []nomadtest.TaskSpec{{
	Name: "t", Driver: "raw_exec", Device: "zfs/dataset/scratch",
	Script: `set -eu
p="$ZFS_SCRATCH_HOST_PATH"
echo "task-euid: $(id -u)"
cp /usr/bin/id "$p/id"
chown 0:0 "$p/id"
chmod 4755 "$p/id"
ls -ln "$p/id"
touch "$p/ready"
i=0
while [ ! -e "$p/release-me" ]; do
  i=$((i + 1))
  if [ "$i" -gt 600 ]; then echo "no release-me" >&2; exit 1; fi
  sleep 1
done
echo "released by the test"
`,
}}}.HCL()

// hostViewJob is a tenant under the exec driver (as nobody): it prints
// its own view of its slot's bind mount (the mountinfo line), waits for
// the test to put a setuid-root binary in its slot, prints the effective
// UID that binary runs with inside the task, and holds the slot until the
// test drops release-me.
var hostViewJob = nomadtest.JobSpec{ID: "suid-view", Tasks: []nomadtest.TaskSpec{{
	Name: "t", Device: "zfs/dataset/scratch",
	Script: `set -eu
p="$ZFS_SCRATCH_PATH"
echo "task-mountinfo: $(grep " $p " /proc/self/mountinfo)"
touch "$p/ready"
i=0
while [ ! -e "$p/planted" ]; do
  i=$((i + 1))
  if [ "$i" -gt 600 ]; then echo "no planted" >&2; exit 1; fi
  sleep 1
done
echo "task-setuid-euid: $("$p/id" -u)"
while [ ! -e "$p/release-me" ]; do
  i=$((i + 1))
  if [ "$i" -gt 600 ]; then echo "no release-me" >&2; exit 1; fi
  sleep 1
done
echo "released by the test"
`,
}}}.HCL()

// hostRawExec is agent configuration appended after the plugin block: it
// enables the raw_exec driver for hostRootJob.
const hostRawExec = `
plugin "raw_exec" {
  config {
    enabled = true
  }
}
`

// hostTaskLine returns what follows prefix on the line of out that starts
// with it.
func hostTaskLine(t *testing.T, out, prefix string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %q line in the task's stdout:\n%s", prefix, out)
	return ""
}

// hostSlotOf returns the index of the slot an allocation of task "t" was
// given.
func hostSlotOf(t *testing.T, a *api.Allocation) int {
	t.Helper()
	must.NotNil(t, a.AllocatedResources)
	tr := a.AllocatedResources.Tasks["t"]
	must.NotNil(t, tr)
	must.SliceLen(t, 1, tr.Devices)
	must.SliceLen(t, 1, tr.Devices[0].DeviceIDs)
	index, ok := strings.CutPrefix(tr.Devices[0].DeviceIDs[0], "scratch-")
	must.True(t, ok, must.Sprintf("device %s", tr.Devices[0].DeviceIDs[0]))
	i, err := strconv.Atoi(index)
	must.NoError(t, err)
	return i
}

// hostWaitFile waits until path exists.
func hostWaitFile(t *testing.T, agent *nomadtest.Agent, path string) {
	t.Helper()
	agent.Wait(t, path, holdTimeout, func() (bool, string) {
		_, err := os.Stat(path)
		return err == nil, fmt.Sprint(err)
	})
}

// hostAssertSafe asserts that the host mount at mp carries nosuid and
// nodev.
func hostAssertSafe(t *testing.T, what, mp string) hostfs.Mount {
	t.Helper()
	m, ok := hostMount(t, mp)
	must.True(t, ok, must.Sprintf("%s: nothing mounted at %s", what, mp))
	must.True(t, m.HasOption("nosuid") && m.HasOption("nodev"), must.Sprintf("%s: %s mount options %v", what, mp, m.Options))
	return m
}

// TestFailClosed_SetuidGrantsNothing: zfs-fuse does not put setuid=off and
// devices=off on its mounts, and a task's bind mount copies the host
// mount's flags, so before the fix a setuid-root binary that a root task
// left in its slot made any host user root. Now the slot's host mount and
// the task's bind mount carry nosuid and nodev: the binary run by user
// nobody from the host, or inside a task, stays nobody, while the same
// binary on a host filesystem without nosuid runs as root (the test can
// see the difference). A class that sets setuid = "on" keeps setuid
// working (nodev still applies).
func TestFailClosed_SetuidGrantsNothing(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	suidSlot := parent + "/suid/0"
	archive := parent + "/.archive"

	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir: filepath.Dir(pluginBin),
		PluginConfig: hostPluginConfig(parent, `
    class "scratch" {
      slots      = 2
      quota      = "32M"
      mount_path = "/zfs/scratch"
    }
    class "suid" {
      slots      = 1
      quota      = "32M"
      mount_path = "/zfs/suid"
      properties = {
        setuid = "on"
      }
    }`) + hostRawExec,
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	agent.WaitForDevice(t, "zfs", "dataset", "suid", 1, deviceTimeout)
	for i := range 2 {
		ds := fmt.Sprintf("%s/scratch/%d", parent, i)
		mp := pool.Prop(t, ds, "mountpoint")
		m := hostAssertSafe(t, "free slot "+ds, mp)
		step("free slot %s: %s %s (setuid=%s)", ds, m.FSType, strings.Join(m.Options, ","), pool.Prop(t, ds, "setuid"))
	}

	// 1. A root tenant leaves a setuid-root binary in its slot; another
	// tenant runs under the exec driver in the other slot.
	rootJob := agent.RegisterJob(t, hostRootJob)
	rootAlloc := agent.WaitForAlloc(t, rootJob, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	viewJob := agent.RegisterJob(t, hostViewJob)
	viewAlloc := agent.WaitForAlloc(t, viewJob, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	// While they run, the slots serve the tenants' datasets.
	rootSlot, viewSlot := servingDataset(pool, parent, hostSlotOf(t, rootAlloc)), servingDataset(pool, parent, hostSlotOf(t, viewAlloc))
	must.NotEq(t, rootSlot, viewSlot)
	rootMP, viewMP := pool.Prop(t, rootSlot, "mountpoint"), pool.Prop(t, viewSlot, "mountpoint")
	hostWaitFile(t, agent, filepath.Join(rootMP, "ready"))
	hostWaitFile(t, agent, filepath.Join(viewMP, "ready"))
	bin := filepath.Join(rootMP, "id")
	fi, err := os.Stat(bin)
	must.NoError(t, err)
	must.True(t, fi.Mode()&os.ModeSetuid != 0, must.Sprintf("the root task's binary is setuid: %v", fi.Mode()))
	must.EqOp(t, uint32(0), fi.Sys().(*syscall.Stat_t).Uid)
	step("root task %s left setuid-root %s (%v)", rootAlloc.ID[:8], bin, fi.Mode())

	// 2. From the host, while the tenant holds the slot: its mount carries
	// nosuid,nodev, and user nobody running the binary stays nobody.
	zfstest.Reachable(t, filepath.Dir(rootMP))
	m := hostAssertSafe(t, "held slot "+rootSlot, rootMP)
	must.EqOp(t, hostNobody, hostEUIDAsNobody(t, bin), must.Sprint("the slot's setuid binary grants nothing"))
	step("host: %s is %s; nobody runs %s as euid %d", rootMP, strings.Join(m.Options, ","), bin, hostNobody)

	// The control: the same binary on a host filesystem without nosuid
	// makes nobody root, so the test sees the difference.
	ctlDir := t.TempDir()
	zfstest.Reachable(t, ctlDir)
	table, err := hostfs.ReadTable()
	must.NoError(t, err)
	var ctlMount hostfs.Mount
	for d := ctlDir; ; d = filepath.Dir(d) {
		if cm, ok := table.At(d); ok {
			ctlMount = cm
			break
		}
		must.NotEq(t, "/", d, must.Sprintf("no mount holds %s", ctlDir))
	}
	if ctlMount.HasOption("nosuid") {
		testenv.Skip(t, fmt.Sprintf("the control needs a host directory without nosuid; %s is on %s (%v)", ctlDir, ctlMount.MountPoint, ctlMount.Options))
	}
	ctl := hostSetuidCopy(t, bin, ctlDir)
	must.EqOp(t, 0, hostEUIDAsNobody(t, ctl), must.Sprint("control: a setuid-root binary without nosuid makes nobody root"))
	must.NoError(t, os.Remove(ctl))
	step("control: nobody runs the copy on %s (%s) as euid 0", ctlMount.MountPoint, ctlMount.FSType)

	// 3. Inside a task: the bind mount carries both flags, and the binary
	// (put into that tenant's slot as the root tenant would) grants nothing.
	hostSetuidCopy(t, bin, viewMP)
	must.NoError(t, os.WriteFile(filepath.Join(viewMP, "planted"), nil, 0o644))
	for _, mp := range []string{rootMP, viewMP} {
		must.NoError(t, os.WriteFile(filepath.Join(mp, "release-me"), nil, 0o644))
	}
	rootAlloc = agent.WaitForAlloc(t, rootJob, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	viewAlloc = agent.WaitForAlloc(t, viewJob, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	rootOut, err := agent.TaskLog(rootAlloc, "t", "stdout")
	must.NoError(t, err)
	must.EqOp(t, "0", hostTaskLine(t, rootOut, "task-euid:"), must.Sprint("the planting task ran as root"))
	viewOut, err := agent.TaskLog(viewAlloc, "t", "stdout")
	must.NoError(t, err)
	t.Logf("exec task stdout:\n%s", viewOut)
	line := hostTaskLine(t, viewOut, "task-mountinfo:")
	tm, err := hostfs.ParseMountInfo(strings.NewReader(line + "\n"))
	must.NoError(t, err, must.Sprintf("the task's mountinfo line %q", line))
	must.SliceLen(t, 1, tm)
	must.EqOp(t, "/zfs/scratch", tm[0].MountPoint)
	must.True(t, tm[0].HasOption("nosuid") && tm[0].HasOption("nodev"), must.Sprintf("the task's mount options %v", tm[0].Options))
	must.EqOp(t, strconv.Itoa(hostNobody), hostTaskLine(t, viewOut, "task-setuid-euid:"))
	step("task: %s is %s; the setuid binary runs as euid %d", tm[0].MountPoint, strings.Join(tm[0].Options, ","), hostNobody)

	// 4. Both slots are released under their tenants' identities and come
	// back fresh (without the binary) and safe.
	for _, a := range []*api.Allocation{rootAlloc, viewAlloc} {
		i := hostSlotOf(t, a)
		agent.Wait(t, "the release of "+a.ID[:8], releaseTimeout, func() (bool, string) {
			return hostReleased(t, pool, archive, a.ID, parent, i)
		})
	}
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	for _, a := range []*api.Allocation{rootAlloc, viewAlloc} {
		ds := servingDataset(pool, parent, hostSlotOf(t, a))
		must.NotEq(t, rootSlot, ds)
		must.NotEq(t, viewSlot, ds)
		mp := pool.Prop(t, ds, "mountpoint")
		entries, err := os.ReadDir(mp)
		must.NoError(t, err)
		must.SliceEmpty(t, entries, must.Sprintf("fresh %s", ds))
		hostAssertSafe(t, "fresh slot "+ds, mp)
	}
	step("both slots released and fresh")

	// 5. A class that asks for setuid = "on" is not forced nosuid (nodev
	// still applies): a setuid-root binary there works, as asked.
	smp := pool.Prop(t, suidSlot, "mountpoint")
	sm, ok := hostMount(t, smp)
	must.True(t, ok, must.Sprintf("%s mounted at %s", suidSlot, smp))
	step("setuid=on slot %s: %s", suidSlot, strings.Join(sm.Options, ","))
	must.False(t, sm.HasOption("nosuid"), must.Sprintf("setuid=on class mount options %v", sm.Options))
	must.True(t, sm.HasOption("nodev"), must.Sprintf("setuid=on class mount options %v", sm.Options))
	zfstest.Reachable(t, filepath.Dir(smp))
	idPath, err := exec.LookPath("id")
	must.NoError(t, err)
	sbin := hostSetuidCopy(t, idPath, smp)
	must.EqOp(t, 0, hostEUIDAsNobody(t, sbin), must.Sprint("setuid=on: the class keeps setuid working"))
	must.NoError(t, os.Remove(sbin))
}
