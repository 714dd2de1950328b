package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
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

// heldArtifact serves one small file over HTTP on loopback and holds each
// GET of it until the test lets it go: a task's artifacts are fetched by a
// prestart hook that runs before the "devices" hook (Nomad's task runner),
// so a held fetch holds the task before its Reserve.
type heldArtifact struct {
	URL     string
	fetched chan string   // the remote address of each GET, as it arrives
	release chan struct{} // one value lets one held GET answer
}

func startHeldArtifact(t *testing.T) *heldArtifact {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	h := &heldArtifact{URL: "http://" + ln.Addr().String() + "/payload.txt",
		fetched: make(chan string, 16), release: make(chan struct{}, 16)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			h.fetched <- r.RemoteAddr
			select {
			case <-h.release:
			case <-r.Context().Done():
				return
			case <-time.After(holdTimeout):
			}
		}
		fmt.Fprintln(w, "payload")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return h
}

// waitFetch waits for the next GET of the artifact.
func (h *heldArtifact) waitFetch(t *testing.T) {
	t.Helper()
	select {
	case from := <-h.fetched:
		t.Logf("artifact fetch from %s held", from)
	case <-time.After(jobTimeout):
		t.Fatalf("no artifact fetch within %s", jobTimeout)
	}
}

// preparedJob is a job whose task fetches the held artifact (at url),
// then writes its allocation ID into its dataset, then runs then; id and
// typ are the job's.
func preparedJob(url, id, typ, then string) string {
	return nomadtest.JobSpec{ID: id, Type: typ, Tasks: []nomadtest.TaskSpec{{
		Name: "t", KillTimeout: "2s", Artifact: url, Device: "zfs/dataset/scratch",
		Script: `left=$(ls -A "$ZFS_SCRATCH_PATH"); if [ -n "$left" ]; then echo "not empty: $left" >&2; exit 3; fi; echo $NOMAD_ALLOC_ID > $ZFS_SCRATCH_PATH/owner.txt; ` + then,
	}}}.HCL()
}

// TestPreparedReserveEndToEnd (issue 10): with a real Nomad agent, an
// allocation placed on a slot finds the slot reserved for it before its
// task's Reserve (held here at its artifact, before the "devices" hook),
// and its Reserve hands the slot over as prepared, with no zfs command of
// its own. The prepared dataset is armed, with no owner recorded until
// the proof behind the Reserve (issue 46). Both ways: a fresh slot, and the spare of a slot whose tenant
// ended (the tenant's dataset's fate written at placement, beside the
// spare's mark). Each new tenant finds its dataset empty.
func TestPreparedReserveEndToEnd(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	art := startHeldArtifact(t)
	pool, parent, agent := oneSlotAgent(t, "TRACE", "1m") // TRACE: the plugin's zfs commands ("ran")
	first := servingDataset(pool, parent, 0)

	// 1. A fresh slot: the writer is placed, and held at its artifact.
	writer := agent.RegisterJob(t, preparedJob(art.URL, "prep-writer", "service", "exec sleep 3600"))
	art.waitFetch(t)
	alloc := agent.WaitForAlloc(t, writer, "placed", jobTimeout, func(*api.Allocation) bool { return true })
	agent.Wait(t, "the slot prepared before the Reserve", holdTimeout, func() (bool, string) {
		n := len(preparedLines(t, agent, alloc.ID))
		return n == 1, fmt.Sprintf("%d \"slot prepared\" lines", n)
	})
	noOwnerBeforeProof(t, pool, first)
	must.SliceEmpty(t, reservedLines(t, agent, alloc.ID), must.Sprint("no Reserve yet: the task is held at its artifact"))
	prepLog := len(logLines(t, agent))
	art.release <- struct{}{}
	alloc = agent.WaitForAlloc(t, writer, "running", jobTimeout, func(a *api.Allocation) bool {
		return a.ClientStatus == api.AllocClientStatusRunning
	})
	lines := reservedLines(t, agent, alloc.ID)
	must.SliceLen(t, 1, lines)
	must.StrContains(t, lines[0], "prepared=true")
	must.StrContains(t, lines[0], "how=fresh")
	must.SliceEmpty(t, zfsSetsSince(t, agent, prepLog, first), must.Sprint("the Reserve of a prepared slot runs no zfs set"))
	mp := pool.Prop(t, first, "mountpoint")
	agent.Wait(t, "owner.txt from the writer", holdTimeout, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(mp, "owner.txt"))
		return err == nil && string(b) == alloc.ID+"\n", fmt.Sprintf("%q %v", b, err)
	})
	agent.Wait(t, "the owner recorded", holdTimeout, func() (bool, string) {
		v := pollProp(pool, first, "nomad-device-zfs:owner")
		return strings.Contains(v, alloc.ID), "owner=" + v
	})

	// 2. The spare of a slot whose tenant ended: the checker waits for the
	// only slot, is placed when the writer stops, and is held again.
	checker := agent.RegisterJob(t, preparedJob(art.URL, "prep-checker", "batch", "echo done"))
	agent.Wait(t, "the slot's spare", holdTimeout, func() (bool, string) {
		s := servingDataset(pool, parent, 0)
		spare := other(first)
		st := pollState(pool, spare)
		return s == first && st == "free", "spare state=" + st
	})
	_, _, err := agent.API.Jobs().Deregister(writer.ID, false, nil)
	must.NoError(t, err)
	art.waitFetch(t)
	next := agent.WaitForAlloc(t, checker, "placed", jobTimeout, func(*api.Allocation) bool { return true })
	spare := other(first)
	agent.Wait(t, "the spare prepared and the writer's dataset's fate written, before the Reserve", holdTimeout, func() (bool, string) {
		n, f := len(preparedLines(t, agent, next.ID)), pollState(pool, first)
		archived := archivedFor(t, pool, parent+"/.archive", alloc.ID) != ""
		return n == 1 && (f == "archived" || archived), fmt.Sprintf("%d \"slot prepared\" lines, writer's dataset %s (in the archive: %v)", n, f, archived)
	})
	noOwnerBeforeProof(t, pool, spare)
	must.SliceEmpty(t, reservedLines(t, agent, next.ID))
	prepLog = len(logLines(t, agent))
	art.release <- struct{}{}
	done := agent.WaitForAlloc(t, checker, "complete", jobTimeout, (*api.Allocation).ClientTerminalStatus)
	if done.ClientStatus != api.AllocClientStatusComplete {
		agent.LogAlloc(t, done)
	}
	must.EqOp(t, api.AllocClientStatusComplete, done.ClientStatus, must.Sprint("the checker found its dataset empty"))
	lines = reservedLines(t, agent, next.ID)
	must.SliceLen(t, 1, lines)
	must.StrContains(t, lines[0], "prepared=true")
	must.StrContains(t, lines[0], "how=spare")
	must.StrContains(t, lines[0], "dataset="+spare)
	must.SliceEmpty(t, zfsSetsSince(t, agent, prepLog, spare))
	agent.Wait(t, "the writer's data in the archive", releaseTimeout, func() (bool, string) {
		a := archivedFor(t, pool, parent+"/.archive", alloc.ID)
		return a != "", "archive=" + a
	})
	dir, unmount := pool.Look(t, archivedFor(t, pool, parent+"/.archive", alloc.ID))
	b, err := os.ReadFile(filepath.Join(dir, "owner.txt"))
	unmount()
	must.NoError(t, err)
	must.EqOp(t, alloc.ID+"\n", string(b))
}

// oneSlotAgent starts a real Nomad agent at logLevel with the plugin and
// one class "scratch" of one slot on a new pool, and waits for its device.
// reserveTimeout is the plugin's reserve_timeout.
func oneSlotAgent(t *testing.T, logLevel, reserveTimeout string) (pool *zfstest.Pool, parent string, agent *nomadtest.Agent) {
	t.Helper()
	pool = zfstest.NewPool(t, 0)
	parent = pool.Dataset("nomad")
	pool.ZFS(t, "create", parent)
	pluginBin := devicetest.BuildPlugin(t)
	agent = nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir: filepath.Dir(pluginBin),
		LogLevel:  logLevel,
		PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "2s"
    reserve_timeout    = %q
    class "scratch" {
      slots = 1
      quota = "32M"
    }
  }
}
`, parent, reserveTimeout),
	})
	agent.WaitForDevice(t, "zfs", "dataset", "scratch", 1, deviceTimeout)
	return pool, parent, agent
}

// other returns the slot's other name: <index> and <index>.alt.
func other(name string) string {
	if n, ok := strings.CutSuffix(name, ".alt"); ok {
		return n
	}
	return name + ".alt"
}

// logLines returns the agent log's lines.
func logLines(t *testing.T, agent *nomadtest.Agent) []string {
	t.Helper()
	b, err := os.ReadFile(agent.LogPath)
	must.NoError(t, err)
	return strings.Split(string(b), "\n")
}

// preparedLines returns the plugin's "slot prepared" lines for allocID.
func preparedLines(t *testing.T, agent *nomadtest.Agent, allocID string) []string {
	t.Helper()
	var out []string
	for _, l := range logLines(t, agent) {
		if strings.Contains(l, "slot prepared") && strings.Contains(l, "allocation "+allocID[:8]) {
			out = append(out, l)
		}
	}
	return out
}

// noOwnerBeforeProof checks that a dataset prepared at placement is armed
// with no owner on ZFS: the owner is recorded only once the proof behind
// its Reserve shows it (issue 46).
func noOwnerBeforeProof(t *testing.T, pool *zfstest.Pool, ds string) {
	t.Helper()
	must.StrHasPrefix(t, "armed:", pool.Prop(t, ds, record.PropState), must.Sprint(ds))
	must.Eq(t, "", pool.Prop(t, ds, record.PropOwner), must.Sprint("no owner before the proof: ", ds))
}

// reservedLines returns the plugin's "slot reserved" lines for allocID.
func reservedLines(t *testing.T, agent *nomadtest.Agent, allocID string) []string {
	t.Helper()
	var out []string
	for _, l := range logLines(t, agent) {
		if strings.Contains(l, "slot reserved") && strings.Contains(l, "allocation "+allocID[:8]) {
			out = append(out, l)
		}
	}
	return out
}

// setArgs matches the arguments of a `zfs set` in a "ran" line.
var setArgs = regexp.MustCompile(`args=\[set, ([^\]]*)\]`)

// zfsSetsSince returns the `zfs set` commands on dataset that the plugin
// ran after line from of the agent log, up to its last "slot reserved".
func zfsSetsSince(t *testing.T, agent *nomadtest.Agent, from int, dataset string) []string {
	t.Helper()
	lines := logLines(t, agent)
	last := from
	for i := from; i < len(lines); i++ {
		if strings.Contains(lines[i], "slot reserved") {
			last = i
		}
	}
	var out []string
	for _, l := range lines[from:last] {
		if m := setArgs.FindStringSubmatch(l); m != nil && strings.HasSuffix(m[1], ", "+dataset) &&
			!strings.Contains(m[1], "nomad-device-zfs:owner=") {
			out = append(out, m[1])
		}
	}
	return out
}
