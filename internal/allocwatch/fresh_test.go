package allocwatch

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/shoenig/test/must"
)

// newWatcher returns a watcher of addr that does not Run: every read it
// makes is one that Fresh started.
func newWatcher(t *testing.T, addr string, cfg Config) *Watcher {
	t.Helper()
	cfg.Address = addr
	w, err := New(cfg, hclog.NewNullLogger())
	must.NoError(t, err)
	return w
}

// fresh calls Fresh with a 10 s deadline.
func fresh(t *testing.T, w *Watcher, since time.Time) (*Snapshot, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return w.Fresh(ctx, since)
}

// Fresh answers with the latest snapshot when its read began at or after
// since, and otherwise reads again; a failed read is an error and keeps the
// last snapshot.
func TestFresh_CachedOrNewRead(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w := newWatcher(t, srv.URL, Config{})

	before := time.Now()
	s1, err := fresh(t, w, before)
	must.NoError(t, err)
	must.False(t, s1.Began.Before(before))
	must.False(t, s1.At.Before(s1.Began))
	must.Eq(t, 1, f.nodeReads())
	latest, err := w.Snapshot()
	must.NoError(t, err)
	must.EqOp(t, s1, latest)

	for _, since := range []time.Time{before.Add(-time.Hour), before, s1.Began} {
		s, err := fresh(t, w, since)
		must.NoError(t, err)
		must.EqOp(t, s1, s, must.Sprint("the latest snapshot qualifies"))
	}
	must.Eq(t, 1, f.nodeReads(), must.Sprint("no new read for a snapshot that qualifies"))

	f.set(alloc("a1", "default", "complete", "scratch-0"))
	since := time.Now()
	s2, err := fresh(t, w, since)
	must.NoError(t, err)
	must.NotEqOp(t, s1, s2)
	must.False(t, s2.Began.Before(since))
	must.True(t, s2.Allocs["a1"].Ended("task"))
	must.Eq(t, 2, f.nodeReads())

	f.with(func(f *fakeNomad) { f.down = 1 })
	_, err = fresh(t, w, time.Now())
	must.Error(t, err)
	latest, lastErr := w.Snapshot()
	must.EqOp(t, s2, latest, must.Sprint("a failed read keeps the last snapshot"))
	must.Error(t, lastErr)
	must.Eq(t, 3, f.nodeReads())

	// While the last read failed, a snapshot that would qualify is not
	// used: the caller learns whether the API answers now.
	s3, err := fresh(t, w, s2.Began)
	must.NoError(t, err)
	must.NotEqOp(t, s2, s3, must.Sprint("a new read after a failed one"))
	must.Eq(t, 4, f.nodeReads())
}

type freshResult struct {
	snap *Snapshot
	err  error
}

// goFresh calls Fresh(since) in a goroutine and returns where its answer
// will come.
func goFresh(w *Watcher, since time.Time) <-chan freshResult {
	out := make(chan freshResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := w.Fresh(ctx, since)
		out <- freshResult{s, err}
	}()
	return out
}

// hold makes the fake hold reads of the node's allocations until the
// returned function (also called when the test ends) releases them.
func hold(t *testing.T, f *fakeNomad) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	f.with(func(f *fakeNomad) { f.gate = gate })
	var once sync.Once
	release = func() {
		once.Do(func() {
			f.with(func(f *fakeNomad) { f.gate = nil })
			close(gate)
		})
	}
	t.Cleanup(release)
	return release
}

// Callers of Fresh with the same since share one read; a caller whose since
// is later than the start of the read in progress gets a read of its own.
func TestFresh_SharedRead(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w := newWatcher(t, srv.URL, Config{NodeID: nodeID})

	release := hold(t, f)
	since := time.Now()
	const callers = 8
	var answers []<-chan freshResult
	for range callers {
		answers = append(answers, goFresh(w, since))
	}
	waitFor(t, "the first read", func() bool { return f.nodeReads() >= 1 })
	release()
	var shared *Snapshot
	for _, ch := range answers {
		r := <-ch
		must.NoError(t, r.err)
		must.False(t, r.snap.Began.Before(since))
		if shared == nil {
			shared = r.snap
		}
		must.EqOp(t, shared, r.snap, must.Sprint("every caller has the one shared read"))
	}
	must.Eq(t, 1, f.nodeReads())

	release = hold(t, f)
	first := goFresh(w, time.Now())
	waitFor(t, "the second read", func() bool { return f.nodeReads() >= 2 })
	later := time.Now() // after the second read began
	second := goFresh(w, later)
	waitFor(t, "a third read", func() bool { return f.nodeReads() >= 3 })
	release()
	r1, r2 := <-first, <-second
	must.NoError(t, r1.err)
	must.NoError(t, r2.err)
	must.NotEqOp(t, r1.snap, r2.snap)
	must.True(t, r1.snap.Began.Before(later))
	must.False(t, r2.snap.Began.Before(later), must.Sprint("a read that began before since was used"))
	must.Eq(t, 3, f.nodeReads())
}

// An API that accepts connections and never answers: Fresh returns at the
// caller's deadline with its error, keeps the last snapshot, and reads again
// once the API is back.
func TestFresh_HangingAPI(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	p := nomadtest.StartProxy(t, srv.URL)
	w := newWatcher(t, p.Addr, Config{NodeID: nodeID})
	s1, err := fresh(t, w, time.Now())
	must.NoError(t, err)

	p.Hang()
	reads := f.nodeReads()
	for range 2 { // the second call shares the hung read
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		_, err = w.Fresh(ctx, start)
		cancel()
		t.Logf("after %s: %v", time.Since(start), err)
		must.ErrorIs(t, err, context.DeadlineExceeded)
		must.Less(t, 2*time.Second, time.Since(start))
	}
	must.Eq(t, reads, f.nodeReads(), must.Sprint("no request reached the API"))
	latest, _ := w.Snapshot()
	must.EqOp(t, s1, latest)

	p.Pass()
	since := time.Now()
	s2, err := fresh(t, w, since)
	must.NoError(t, err)
	must.False(t, s2.Began.Before(since))
}

// Gone is true only when the namespace-scoped list positively lacks the
// allocation or shows it complete, or failed with the task dead; any doubt
// is an error. A failed allocation whose task has not run yet (a poststop
// task: Nomad reports the allocation failed as soon as one task fails) is
// not gone.
func TestGone_Fake(t *testing.T) {
	f, srv := newFake(t)
	poststop := alloc("f2", "default", "failed", "scratch-8")
	poststop.TaskStates["task"] = &api.TaskState{State: "pending"}
	f.set(
		poststop,
		alloc("gc1", "default", "running", "scratch-0"),
		alloc("c1", "default", "complete", "scratch-1"),
		alloc("f1", "default", "failed", "scratch-2"),
		alloc("r1", "default", "running", "scratch-3"),
		alloc("l1", "default", "lost", "scratch-4"),
		alloc("p1", "default", "pending", "scratch-5"),
		alloc("b1", "prod", "running", "scratch-6"),
		alloc("b2", "prod", "complete", "scratch-7"),
	)
	f.with(func(f *fakeNomad) { f.gone["gc1"], f.gone["b2"], f.hidden["prod"] = true, true, true })
	w := newWatcher(t, srv.URL, Config{NodeID: nodeID})

	cases := []struct {
		name, ns, id string
		down         int  // the API answers 500 this many times
		gone         bool // else an error
		permission   bool // the error wraps ErrPermission
	}{
		{name: "garbage collected", ns: "default", id: "gc1", gone: true},
		{name: "never existed", ns: "default", id: "nope", gone: true},
		{name: "complete", ns: "default", id: "c1", gone: true},
		{name: "failed", ns: "default", id: "f1", gone: true},
		{name: "failed, its task not run yet", ns: "default", id: "f2"},
		{name: "running, missing from the node list", ns: "default", id: "r1"},
		{name: "lost", ns: "default", id: "l1"},
		{name: "pending", ns: "default", id: "p1"},
		{name: "403, live", ns: "prod", id: "b1", permission: true},
		{name: "403, gone", ns: "prod", id: "b2", permission: true},
		{name: "namespace unknown", ns: "", id: "gc1"},
		{name: "API error", ns: "default", id: "gc1", down: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.with(func(f *fakeNomad) { f.down = tc.down })
			g, err := gone(t, w, tc.ns, tc.id)
			t.Logf("gone=%v err=%v", g, err)
			if tc.gone {
				must.NoError(t, err)
				must.True(t, g)
				return
			}
			must.Error(t, err)
			must.False(t, g)
			must.EqOp(t, tc.permission, errors.Is(err, ErrPermission))
		})
	}
}

// rawExecConfig enables the raw_exec driver, for a job whose allocation
// stays live without building a chroot.
const rawExecConfig = `plugin "raw_exec" {
  config {
    enabled = true
  }
}`

// hiddenJob runs in namespace "other" for at most two minutes.
const hiddenJob = `job "hidden" {
  namespace   = "other"
  datacenters = ["*"]
  type        = "batch"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["120"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}`

func randomUUID(t *testing.T) string {
	t.Helper()
	var b [16]byte
	_, err := rand.Read(b[:])
	must.NoError(t, err)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// tokenWatcher returns a watcher of the agent that reads its token from a
// file holding secret.
func tokenWatcher(t *testing.T, a *nomadtest.Agent, secret string) *Watcher {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	must.NoError(t, os.WriteFile(file, []byte(secret+"\n"), 0o600))
	return newWatcher(t, a.Addr, Config{TokenFile: file})
}

// stopLiveJob purges the job and waits until the client has destroyed its
// allocation, whose directories Nomad mounts (tmpfs secrets and private),
// then stops the agent. On return nothing is mounted under the agent's
// directory: a mount still there is unmounted and fails the test, since
// stopping an agent with a live allocation leaves its mounts behind and
// the test's TempDir cannot be removed.
func stopLiveJob(t *testing.T, a *nomadtest.Agent, jobID string, q *api.WriteOptions) {
	t.Helper()
	if !a.Exited() {
		_, _, err := a.API.Jobs().Deregister(jobID, true, q)
		must.NoError(t, err)
		deadline := time.Now().Add(30 * time.Second)
		for len(mountsUnder(t, a.Dir)) > 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := a.Stop(); err != nil {
		t.Logf("stopping the agent: %v", err)
	}
	for _, m := range mountsUnder(t, a.Dir) {
		t.Errorf("%s still mounted after the agent stopped; unmounting it: %v", m, syscall.Unmount(m, 0))
	}
}

// mountsUnder returns the mount points below dir, deepest first.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	must.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		// Spaces and other bytes in mount points are octal escapes; the
		// agent's directory has none.
		if strings.HasPrefix(fields[1], dir+"/") {
			out = append(out, fields[1])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out
}

// rawGet logs and returns what the agent answers to a GET of path with
// secret, so the report can quote Nomad's own words.
func rawGet(t *testing.T, a *nomadtest.Agent, secret, path string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.Addr+path, nil)
	must.NoError(t, err)
	req.Header.Set("X-Nomad-Token", secret)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	t.Logf("GET %s -> %d %q", path, resp.StatusCode, body)
	return resp.StatusCode
}

// TestGone_RealAgentNamespaceACL asks a real Nomad agent with ACLs about a
// live allocation in namespace "other" and about a random ID, with a token
// limited to namespace "default" and with the management token. The node
// list silently leaves out what the limited token may not read, so only a
// 403 from the namespace-scoped list keeps Gone from saying "gone" there.
func TestGone_RealAgentNamespaceACL(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	t.Parallel()
	a := nomadtest.StartAgent(t, nomadtest.Options{ACL: true, PluginConfig: rawExecConfig})
	_, err := a.API.Namespaces().Register(&api.Namespace{Name: "other"}, nil)
	must.NoError(t, err)
	_, err = a.API.ACLPolicies().Upsert(&api.ACLPolicy{Name: "default-only",
		Rules: "node {\n  policy = \"read\"\n}\n" + `namespace "default" { capabilities = ["read-job"] }`}, nil)
	must.NoError(t, err)
	tok, _, err := a.API.ACLTokens().Create(&api.ACLToken{Name: "default-only", Type: "client", Policies: []string{"default-only"}}, nil)
	must.NoError(t, err)
	limitedSecret := tok.SecretID

	// A live allocation in namespace "other", on the agent's node.
	job, err := a.API.Jobs().ParseHCL(hiddenJob, true)
	must.NoError(t, err)
	inOther := &api.WriteOptions{Namespace: "other"}
	_, _, err = a.API.Jobs().Register(job, inOther)
	must.NoError(t, err)
	t.Cleanup(func() { stopLiveJob(t, a, *job.ID, inOther) })
	var live string
	a.Wait(t, "the allocation in namespace other to run", 2*time.Minute, func() (bool, string) {
		stubs, _, err := a.API.Jobs().Allocations(*job.ID, false, &api.QueryOptions{Namespace: "other"})
		if err != nil || len(stubs) == 0 {
			return false, fmt.Sprintf("%d allocations, %v", len(stubs), err)
		}
		live = stubs[0].ID
		return stubs[0].ClientStatus == api.AllocClientStatusRunning, stubs[0].ClientStatus
	})
	random := randomUUID(t)

	limited, mgmt := tokenWatcher(t, a, limitedSecret), tokenWatcher(t, a, a.Token)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The node list: the management token sees the allocation, the limited
	// token silently does not. Only Visibility tells them apart.
	for _, c := range []struct {
		name string
		w    *Watcher
		sees bool
	}{{"management", mgmt, true}, {"default-only", limited, false}} {
		since := time.Now()
		snap, err := c.w.Fresh(ctx, since)
		must.NoError(t, err, must.Sprint(c.name))
		must.False(t, snap.Began.Before(since))
		_, sees := snap.Allocs[live]
		must.EqOp(t, c.sees, sees, must.Sprintf("%s token: allocations %v", c.name, snap.SortedIDs()))
		must.EqOp(t, c.sees, c.w.Visibility(ctx).All, must.Sprint(c.name))
	}

	// What the agent answers the limited token, in its own words.
	must.EqOp(t, http.StatusForbidden, rawGet(t, a, limitedSecret, "/v1/allocations?namespace=other&prefix="+random))
	must.EqOp(t, http.StatusForbidden, rawGet(t, a, limitedSecret, "/v1/allocations?namespace=other&prefix="+live))
	rawGet(t, a, limitedSecret, "/v1/allocation/"+live)
	rawGet(t, a, a.Token, "/v1/allocation/"+random)
	rawGet(t, a, limitedSecret, "/v1/allocations?namespace=*&prefix="+live)

	cases := []struct {
		name       string
		w          *Watcher
		ns, id     string
		gone       bool // else an error
		permission bool // the error wraps ErrPermission
	}{
		{name: "limited, other, random", w: limited, ns: "other", id: random, permission: true},
		{name: "limited, other, live", w: limited, ns: "other", id: live, permission: true},
		{name: "limited, namespace that does not exist", w: limited, ns: "nonexistent", id: random, permission: true},
		{name: "limited, default, random", w: limited, ns: "default", id: random, gone: true},
		// Nomad's "*" lists every namespace the token may read and silently
		// leaves out the others: no namespace can be named "*", so Gone
		// must refuse it rather than answer from a filtered list.
		{name: "limited, wildcard namespace, live", w: limited, ns: "*", id: live},
		{name: "management, other, random", w: mgmt, ns: "other", id: random, gone: true},
		{name: "management, other, live", w: mgmt, ns: "other", id: live},
		// The list is scoped to the namespace asked: the owner's recorded
		// namespace must be the allocation's.
		{name: "management, wrong namespace, live", w: mgmt, ns: "default", id: live, gone: true},
	}
	// Holds, on the same allocations: the live one holds no device of the
	// plugin, so it proves nothing for a device and passes for none.
	holds := []struct {
		name       string
		w          *Watcher
		ns, id     string
		devices    []string
		ok         bool
		permission bool
		errHas     string
	}{
		{name: "management, other, live, no device", w: mgmt, ns: "other", id: live, ok: true},
		{name: "management, other, live, a device it does not hold", w: mgmt, ns: "other", id: live, devices: []string{"scratch-0"}, errHas: "does not hold scratch-0"},
		{name: "management, wrong namespace", w: mgmt, ns: "default", id: live, errHas: "not found"},
		{name: "management, random", w: mgmt, ns: "other", id: random, errHas: "not found"},
		{name: "limited, other, live", w: limited, ns: "other", id: live, permission: true},
		{name: "limited, wildcard namespace", w: limited, ns: "*", id: live, errHas: "not a Nomad namespace name"},
	}
	for _, tc := range holds {
		t.Run("Holds/"+tc.name, func(t *testing.T) {
			err := tc.w.Holds(ctx, tc.ns, tc.id, "t", tc.devices)
			t.Logf("err=%v", err)
			if tc.ok {
				must.NoError(t, err)
				return
			}
			must.Error(t, err)
			must.EqOp(t, tc.permission, errors.Is(err, ErrPermission))
			if tc.errHas != "" {
				must.StrContains(t, err.Error(), tc.errHas)
			}
		})
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := tc.w.Gone(ctx, tc.ns, tc.id, "t")
			t.Logf("gone=%v err=%v", g, err)
			if tc.gone {
				must.NoError(t, err)
				must.True(t, g)
				return
			}
			must.Error(t, err, must.Sprintf("Gone said %v", g))
			must.False(t, g)
			must.EqOp(t, tc.permission, errors.Is(err, ErrPermission))
		})
	}
}
