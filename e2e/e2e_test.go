package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

func TestMain(m *testing.M) { zfstest.Main(m, devicetest.RemoveBuilt) }

const (
	// deviceTimeout covers plugin start-up and the first fingerprint.
	deviceTimeout = 2 * time.Minute
	// jobTimeout covers the exec driver's first use, which builds a chroot
	// (about 15 s here), plus scheduling and the task itself.
	jobTimeout = 5 * time.Minute
	// statsTimeout covers stats_period plus zfs-fuse's lag in space
	// figures (up to about 30 s on a quiet pool).
	statsTimeout = 2 * time.Minute
	// holdTimeout bounds the waits for what happens while the task runs;
	// holdSeconds, how long the task waits for release-me, exceeds them all.
	holdTimeout = time.Minute
	holdSeconds = 600
	// releaseTimeout covers the plugin's learning that the allocation ended
	// (it watches the node's allocations) and the release itself.
	releaseTimeout = 2 * time.Minute

	// blobKiB is what the task writes besides hello.txt, so that the
	// dataset's "used" visibly grows (random data: compression cannot
	// shrink it).
	blobKiB = 2048
)

func jobSpec() string {
	return strings.NewReplacer("@BLOB_KIB@", fmt.Sprint(blobKiB), "@HOLD_SECONDS@", fmt.Sprint(holdSeconds)).Replace(jobHCL)
}

func pluginConfig(parent string) string {
	return fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    stats_period       = "2s"

    class "scratch" {
      slots      = 2
      quota      = "64M"
      mount_path = "/zfs/scratch"
      properties = {
        compression = "on"
      }
    }
  }
}
`, parent)
}

// The task runs as nobody under the exec driver; the plugin makes the
// dataset's root writable for it and Nomad bind-mounts it at
// $ZFS_SCRATCH_PATH. After writing, the task waits (bounded) until the test
// drops release-me into the dataset from the host, so that the test sees
// the dataset while it is reserved.
var jobHCL = nomadtest.JobSpec{ID: "e2e-scratch", Tasks: []nomadtest.TaskSpec{{
	Name: "write", Memory: 64, Device: "zfs/dataset/scratch",
	Script: `set -eu
echo "dataset=$ZFS_SCRATCH_DATASET"
echo "path=$ZFS_SCRATCH_PATH"
echo "host_path=$ZFS_SCRATCH_HOST_PATH"
echo "id=$(id)"
echo "hello from alloc $NOMAD_ALLOC_ID" > "$ZFS_SCRATCH_PATH/hello.txt"
dd if=/dev/urandom of="$ZFS_SCRATCH_PATH/blob" bs=1024 count=@BLOB_KIB@ 2>/dev/null
sync
ls -ln "$ZFS_SCRATCH_PATH"
df -k "$ZFS_SCRATCH_PATH" || true
# Hold the dataset until the test has looked at it from the host.
i=0
while [ ! -e "$ZFS_SCRATCH_PATH/release-me" ]; do
  i=$((i + 1))
  if [ "$i" -gt @HOLD_SECONDS@ ]; then
    echo "no release-me after @HOLD_SECONDS@ s" >&2
    exit 1
  fi
  sleep 1
done
echo "released by the test"
`,
}}}.HCL()

// TestScratchDatasetEndToEnd runs the plugin in a real Nomad agent on a real
// (zfs-fuse or kernel) pool, through a dataset's whole life: the device shows
// up with its attributes; an exec task writes into its dataset through the
// bind mount; the write lands in the host dataset the scheduler chose, which
// is recorded as reserved by the allocation; the device stats reach the
// node's stats API; and once the allocation is complete the plugin archives
// the dataset (data intact) and puts a fresh one in its place.
func TestScratchDatasetEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs a job")
	step := stepper(t)

	pool := zfstest.NewPool(t, 0)
	parent := pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	step("pool %s, parent dataset %s", pool.Name, parent)

	pluginBin := devicetest.BuildPlugin(t)
	step("built plugin %s", pluginBin)

	agent := nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir:    filepath.Dir(pluginBin),
		PluginConfig: pluginConfig(parent),
	})
	step("agent up at %s, node %s", agent.Addr, agent.NodeID)

	dev := agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)
	step("device %s: %s", dev.ID(), nomadtest.DescribeDevices([]*api.NodeDeviceResource{dev}))
	var ids []string
	for _, inst := range dev.Instances {
		ids = append(ids, inst.ID)
	}
	sort.Strings(ids)
	must.Eq(t, []string{"scratch-0", "scratch-1"}, ids)

	for _, k := range []string{"quota", "pool", "mount_path"} {
		must.MapContainsKey(t, dev.Attributes, k, must.Sprintf("device attributes: %v", attrString(dev.Attributes)))
	}
	must.Eq(t, "64 MiB", attrString(dev.Attributes)["quota"])
	must.Eq(t, pool.Name, attrString(dev.Attributes)["pool"])
	must.Eq(t, "/zfs/scratch", attrString(dev.Attributes)["mount_path"])

	job := agent.RegisterJob(t, jobSpec())
	alloc := agent.WaitForAlloc(t, job, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	step("alloc %s running", alloc.ID)

	// The scheduler's choice, from the allocation.
	must.NotNil(t, alloc.AllocatedResources)
	tr := alloc.AllocatedResources.Tasks["write"]
	must.NotNil(t, tr)
	must.SliceLen(t, 1, tr.Devices)
	must.SliceLen(t, 1, tr.Devices[0].DeviceIDs)
	devID := tr.Devices[0].DeviceIDs[0]
	index := strings.TrimPrefix(devID, "scratch-")
	slotDS := parent + "/scratch/" + index
	otherDS := parent + "/scratch/" + map[string]string{"0": "1", "1": "0"}[index]
	slotMP := pool.Prop(t, slotDS, "mountpoint")

	// While the task holds it: the file is in the host dataset the scheduler
	// chose (and only there), which the plugin records as reserved by this
	// allocation.
	want := "hello from alloc " + alloc.ID + "\n"
	agent.Wait(t, "hello.txt in "+slotDS, holdTimeout, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(slotMP, "hello.txt"))
		if err != nil {
			return false, err.Error()
		}
		return string(b) == want, fmt.Sprintf("content %q", b)
	})
	step("found %s/hello.txt in %s", slotMP, slotDS)
	_, err := os.Stat(filepath.Join(pool.Prop(t, otherDS, "mountpoint"), "hello.txt"))
	must.True(t, os.IsNotExist(err), must.Sprintf("hello.txt must not be in %s: %v", otherDS, err))
	must.EqOp(t, "on", pool.Prop(t, slotDS, "compression"))
	agent.Wait(t, "the owner's alloc ID stamped on "+slotDS, holdTimeout, func() (bool, string) {
		v := recordedOwner(t, pool, slotDS).AllocID
		return v == alloc.ID, fmt.Sprintf("owner alloc ID=%q", v)
	})
	must.EqOp(t, "reserved", stateOf(t, pool, slotDS))
	must.EqOp(t, "free", stateOf(t, pool, otherDS))
	step("%s is reserved by %s", slotDS, alloc.ID)

	// The stats stream reaches the client's host stats. The reserved slot's
	// "used" grows by the blob once ZFS commits the transaction group.
	var stats *api.DeviceStats
	agent.Wait(t, "device stats with the blob counted", statsTimeout, func() (bool, string) {
		hs, err := agent.API.Nodes().Stats(agent.NodeID, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, g := range hs.DeviceStats {
			if g.Vendor != "zfs" || g.Type != "dataset" || g.Name != "scratch" {
				continue
			}
			if len(g.InstanceStats) != 2 {
				return false, fmt.Sprintf("%d instance stats", len(g.InstanceStats))
			}
			s := g.InstanceStats[devID]
			if s == nil || s.Stats == nil || s.Stats.Attributes["used"] == nil || s.Stats.Attributes["used"].IntNumeratorVal == nil {
				return false, fmt.Sprintf("no used figure for %s: %+v", devID, s)
			}
			used := *s.Stats.Attributes["used"].IntNumeratorVal
			if used < blobKiB*1024 {
				return false, fmt.Sprintf("%s used %d bytes", devID, used)
			}
			stats = s
			return true, ""
		}
		return false, fmt.Sprintf("no zfs/dataset/scratch among %d device stat groups", len(hs.DeviceStats))
	})
	must.NotNil(t, stats.Summary)
	must.NotNil(t, stats.Summary.IntNumeratorVal)
	must.NotNil(t, stats.Summary.IntDenominatorVal)
	must.EqOp(t, int64(64<<20), *stats.Summary.IntDenominatorVal)
	step("device stats for %s: used %d of %d bytes (%s)", devID,
		*stats.Summary.IntNumeratorVal, *stats.Summary.IntDenominatorVal, stats.Summary.Desc)

	// Let the task finish.
	must.NoError(t, os.WriteFile(filepath.Join(slotMP, "release-me"), nil, 0o644))
	alloc = agent.WaitForAlloc(t, job, "complete", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusComplete
	})
	step("alloc %s complete", alloc.ID)
	stdout, err := agent.TaskLog(alloc, "write", "stdout")
	must.NoError(t, err)
	t.Logf("task stdout:\n%s", stdout)
	must.StrContains(t, stdout, "dataset="+slotDS+"\n")
	must.StrContains(t, stdout, "path=/zfs/scratch\n")
	must.StrContains(t, stdout, "host_path="+slotMP+"\n")
	must.StrContains(t, stdout, "released by the test\n")

	// Once the allocation is over the plugin takes the slot back: the
	// dataset moves to <parent>/.archive with its owner recorded, and the
	// slot serves a fresh, empty dataset (its spare, made while the task
	// ran, or one made in its place).
	var archived, freshDS string
	idx, err := strconv.Atoi(index)
	must.NoError(t, err)
	agent.Wait(t, "the release of "+slotDS+" into the archive", releaseTimeout, func() (bool, string) {
		archived = archivedFor(t, pool, parent+"/.archive", alloc.ID)
		freshDS = servingDataset(pool, parent, idx)
		if archived == "" {
			return false, "nothing in the archive for the allocation; the slot serves " + freshDS
		}
		st := pollState(pool, archived)
		fresh := pollState(pool, freshDS)
		return st == "archived" && fresh == "free", fmt.Sprintf("%s is %s, %s is %s", archived, st, freshDS, fresh)
	})
	step("released: %s archived as %s; the slot serves %s", slotDS, archived, freshDS)
	must.StrHasPrefix(t, parent+"/.archive/"+devID+".default.e2e-scratch.g.write."+alloc.ID[:8]+".", archived)
	_, err = os.Stat(filepath.Join(pool.Prop(t, freshDS, "mountpoint"), "hello.txt"))
	must.True(t, os.IsNotExist(err), must.Sprintf("the fresh %s must be empty: %v", freshDS, err))
	must.EqOp(t, "", pool.Prop(t, freshDS, record.PropOwner))
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)

	// The archived data is intact: mount it, as an operator would.
	archMP, unmount := pool.Look(t, archived)
	b, err := os.ReadFile(filepath.Join(archMP, "hello.txt"))
	must.NoError(t, err)
	must.EqOp(t, want, string(b))
	fi, err := os.Stat(filepath.Join(archMP, "blob"))
	must.NoError(t, err)
	must.EqOp(t, int64(blobKiB*1024), fi.Size())
	unmount()
	step("archived %s holds the task's files", archived)
}

// attrString renders device attributes as "value unit" strings.
func attrString(attrs map[string]*api.Attribute) map[string]string {
	out := make(map[string]string, len(attrs))
	for k, a := range attrs {
		var v string
		switch {
		case a == nil:
			v = "<nil>"
		case a.IntVal != nil:
			v = fmt.Sprint(*a.IntVal)
		case a.FloatVal != nil:
			v = fmt.Sprint(*a.FloatVal)
		case a.StringVal != nil:
			v = *a.StringVal
		case a.BoolVal != nil:
			v = fmt.Sprint(*a.BoolVal)
		}
		if a != nil && a.Unit != "" {
			v += " " + a.Unit
		}
		out[k] = v
	}
	return out
}
