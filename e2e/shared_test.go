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

// sharedReaderJob reads the shared class's file, tries to write beside it,
// says which of the two happened on stdout, and holds the device.
func sharedReaderJob(id string) string {
	return nomadtest.JobSpec{ID: id, Type: "service", Reschedule: true, Tasks: []nomadtest.TaskSpec{{
		Name: "r", KillTimeout: "2s",
		Device: "zfs/dataset", DeviceConstraints: []nomadtest.Constraint{{Attribute: "${device.attr.shared}", Value: "true"}},
		Script: `echo "read: $(cat $ZFS_MODELS_PATH/weights.txt)"; if echo x > $ZFS_MODELS_PATH/$NOMAD_ALLOC_ID 2>/dev/null; then echo WROTE; else echo READ-ONLY; fi; exec sleep 3600`,
	}}}.HCL()
}

// operatorView is what must not change of the operator's dataset: its
// GUID, every property and its source but the space figures (which move
// as ZFS commits), and its files.
func operatorView(t *testing.T, pool *zfstest.Pool, ds string) string {
	t.Helper()
	var b strings.Builder
	for _, line := range strings.Split(pool.ZFS(t, "get", "-H", "-p", "-o", "property,value,source", "all", ds), "\n") {
		prop, _, _ := strings.Cut(line, "\t")
		switch {
		case prop == "used", prop == "available", prop == "referenced", prop == "written",
			prop == "compressratio", prop == "refcompressratio",
			strings.HasPrefix(prop, "usedby"), strings.HasPrefix(prop, "logical"):
			continue
		}
		b.WriteString(line + "\n")
	}
	mp := pool.Prop(t, ds, "mountpoint")
	entries, err := os.ReadDir(mp)
	must.NoError(t, err)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(mp, e.Name()))
		must.NoError(t, err)
		fmt.Fprintf(&b, "file %s: %q\n", e.Name(), data)
	}
	return b.String()
}

// TestSharedClassEndToEnd: three allocations hold a read-only shared class
// at once, each reads the operator's file and fails to write; after every
// allocation has ended the operator's dataset is as it was (GUID,
// properties, files). Unmounting the dataset makes every instance
// unhealthy in Nomad with the reason, and mounting it again heals them.
func TestSharedClassEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	step := stepper(t)
	pool := zfstest.NewPool(t, 0)
	parent, models := pool.Dataset("nomad"), pool.Dataset("models")
	pool.ZFS(t, "create", parent)
	pool.ZFS(t, "create", models)
	must.NoError(t, os.WriteFile(filepath.Join(pool.Prop(t, models, "mountpoint"), "weights.txt"), []byte("the operator's weights\n"), 0o644))
	before := operatorView(t, pool, models)

	pluginBin := devicetest.BuildPlugin(t)
	agent := nomadtest.StartAgent(t, nomadtest.Options{PluginDir: filepath.Dir(pluginBin), PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    class "models" {
      shared     = true
      dataset    = %q
      slots      = 3
      mount_path = "/models"
    }
    class "scratch" {
      slots = 1
      quota = "32M"
    }
  }
}
`, parent, models)})
	dev := agent.WaitForDevice(t, "zfs", "dataset", "models", 3, deviceTimeout)
	attrs := attrString(dev.Attributes)
	must.Eq(t, "true", attrs["shared"])
	must.Eq(t, "true", attrs["read_only"])
	must.Eq(t, "/models", attrs["mount_path"])
	scratch := agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	must.Eq(t, "false", attrString(scratch.Attributes)["shared"])
	step("agent up at %s; models: %s", agent.Addr, nomadtest.DescribeDevices([]*api.NodeDeviceResource{dev}))

	// Three at once. The constraint on ${device.attr.shared} keeps them
	// off the exclusive class.
	var allocs []*api.Allocation
	var jobs []nomadtest.Job
	for i := 0; i < 3; i++ {
		jobs = append(jobs, agent.RegisterJob(t, sharedReaderJob(fmt.Sprintf("reader-%d", i))))
	}
	for _, job := range jobs {
		allocs = append(allocs, agent.WaitForAlloc(t, job, "running", jobTimeout, func(a *api.Allocation) bool {
			return a.ClientStatus == api.AllocClientStatusRunning
		}))
	}
	held := map[string]bool{}
	for _, a := range allocs {
		must.Eq(t, "models", a.AllocatedResources.Tasks["r"].Devices[0].Name)
		held[a.AllocatedResources.Tasks["r"].Devices[0].DeviceIDs[0]] = true
		var out string
		agent.Wait(t, "the reader's verdict in its stdout", time.Minute, func() (bool, string) {
			out, _ = agent.TaskLog(a, "r", "stdout")
			return strings.Contains(out, "WROTE") || strings.Contains(out, "READ-ONLY"), out
		})
		must.StrContains(t, out, "read: the operator's weights")
		must.StrContains(t, out, "READ-ONLY")
	}
	must.MapLen(t, 3, held, must.Sprint("three allocations hold three instances of the one dataset"))
	for _, a := range allocs {
		a, _, err := agent.API.Allocations().Info(a.ID, nil)
		must.NoError(t, err)
		must.Eq(t, api.AllocClientStatusRunning, a.ClientStatus, must.Sprint("all three are running at once"))
	}
	step("three readers running, each read the file and could not write")

	for _, job := range jobs {
		_, _, err := agent.API.Jobs().Deregister(job.ID, false, nil)
		must.NoError(t, err)
	}
	for _, job := range jobs {
		agent.WaitForAlloc(t, job, "stopped", jobTimeout, (*api.Allocation).ClientTerminalStatus)
	}
	// Give the release loop time to act (it must do nothing here).
	time.Sleep(6 * time.Second)
	must.Eq(t, before, operatorView(t, pool, models))
	agent.WaitForDevice(t, "zfs", "dataset", "models", 3, deviceTimeout)
	step("all ended; the operator's dataset is as it was and the three instances are healthy")

	// Unmounted: unhealthy with the reason, and the plugin goes on.
	pool.ZFS(t, "unmount", models)
	agent.Wait(t, "the shared instances unhealthy with the reason", deviceTimeout, func() (bool, string) {
		desc := sharedHealth(t, agent)
		return strings.Count(desc, "is not mounted") == 3, desc
	})
	pool.ZFS(t, "mount", models)
	agent.WaitForDevice(t, "zfs", "dataset", "models", 3, deviceTimeout)
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	must.Eq(t, before, operatorView(t, pool, models))
	step("unmounted: unhealthy with the reason; mounted again: healthy")
}

// sharedHealth describes the models instances as Nomad has them.
func sharedHealth(t *testing.T, agent *nomadtest.Agent) string {
	t.Helper()
	n, _, err := agent.API.Nodes().Info(agent.NodeID, nil)
	if err != nil || n.NodeResources == nil {
		return fmt.Sprint(err)
	}
	var b strings.Builder
	for _, g := range n.NodeResources.Devices {
		if g.Name != "models" {
			continue
		}
		for _, in := range g.Instances {
			fmt.Fprintf(&b, "%s healthy=%v %s; ", in.ID, in.Healthy, in.HealthDescription)
		}
	}
	return b.String()
}
