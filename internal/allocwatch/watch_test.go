package allocwatch

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

// fakeNomad is a small stand-in for the Nomad HTTP API, for the faults a
// real agent cannot easily be made to show: 403s, a token limited to one
// namespace, garbage-collected allocations, stale and repeated answers, and
// an API that is down for a while. The happy path runs against a real agent
// in e2e/.
type fakeNomad struct {
	mu       sync.Mutex
	index    uint64
	allocs   []*api.Allocation
	gone     map[string]bool // allocations the server no longer has
	hidden   map[string]bool // namespaces the token cannot read
	down     int             // answer 500 to this many requests
	stale    *staleAnswer    // answer the node list with this once
	selfCode int             // status for /v1/agent/self (0: 200)
	tokens   []string        // X-Nomad-Token of each request
	requests []string
}

// staleAnswer is an old answer, as a lagging server would give.
type staleAnswer struct {
	index  uint64
	allocs []*api.Allocation
}

const nodeID = "f1e2d3c4-0000-0000-0000-000000000000"

func newFake(t *testing.T) (*fakeNomad, *httptest.Server) {
	t.Helper()
	f := &fakeNomad{index: 10, gone: map[string]bool{}, hidden: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeNomad) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tokens = append(f.tokens, r.Header.Get("X-Nomad-Token"))
	f.requests = append(f.requests, r.URL.Path)
	if f.down > 0 {
		f.down--
		f.mu.Unlock()
		http.Error(w, "no cluster leader", http.StatusInternalServerError)
		return
	}
	f.mu.Unlock()

	switch {
	case r.URL.Path == "/v1/agent/self":
		f.mu.Lock()
		code := f.selfCode
		f.mu.Unlock()
		if code != 0 {
			http.Error(w, "Permission denied", code)
			return
		}
		writeJSON(w, 0, map[string]any{"stats": map[string]map[string]string{"client": {"node_id": nodeID}}})
	case r.URL.Path == "/v1/nodes":
		host, _ := os.Hostname()
		writeJSON(w, 1, []map[string]any{{"ID": nodeID, "Name": host}, {"ID": "other", "Name": "elsewhere"}})
	case r.URL.Path == "/v1/node/"+nodeID+"/allocations":
		f.nodeAllocs(w, r)
	case r.URL.Path == "/v1/allocations":
		f.listAllocs(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeNomad) nodeAllocs(w http.ResponseWriter, r *http.Request) {
	wait, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	deadline := time.Now().Add(300 * time.Millisecond)
	for {
		f.mu.Lock()
		if f.stale != nil {
			old := f.stale
			f.stale = nil
			f.mu.Unlock()
			writeJSON(w, old.index, old.allocs)
			return
		}
		if f.index > wait || time.Now().After(deadline) {
			out, idx := f.visibleLocked(), f.index
			f.mu.Unlock()
			writeJSON(w, idx, out)
			return
		}
		f.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
}

// visibleLocked filters out allocations in namespaces the token cannot
// read, silently, as Nomad does.
func (f *fakeNomad) visibleLocked() []*api.Allocation {
	var out []*api.Allocation
	for _, a := range f.allocs {
		if !f.hidden[a.Namespace] && !f.gone[a.ID] {
			out = append(out, a)
		}
	}
	return out
}

func (f *fakeNomad) listAllocs(w http.ResponseWriter, r *http.Request) {
	ns := r.URL.Query().Get("namespace")
	prefix := r.URL.Query().Get("prefix")
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hidden[ns] {
		http.Error(w, "Permission denied", http.StatusForbidden)
		return
	}
	out := []map[string]any{}
	for _, a := range f.allocs {
		if a.Namespace == ns && strings.HasPrefix(a.ID, prefix) && !f.gone[a.ID] {
			out = append(out, map[string]any{"ID": a.ID, "Namespace": a.Namespace, "ClientStatus": a.ClientStatus, "TaskStates": a.TaskStates})
		}
	}
	writeJSON(w, f.index, out)
}

func writeJSON(w http.ResponseWriter, index uint64, v any) {
	w.Header().Set("X-Nomad-Index", strconv.FormatUint(index, 10))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// set replaces the allocations and bumps the index.
func (f *fakeNomad) set(allocs ...*api.Allocation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs = allocs
	f.index++
}

func (f *fakeNomad) with(fn func(f *fakeNomad)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func alloc(id, ns, status string, devices ...string) *api.Allocation {
	return &api.Allocation{
		ID: id, Namespace: ns, JobID: "job", TaskGroup: "grp", Name: "job.grp[0]", ClientStatus: status,
		AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{
			"task": {Devices: []*api.AllocatedDeviceResource{{Vendor: "zfs", Type: "dataset", Name: "scratch", DeviceIDs: devices}}},
			"side": {Devices: []*api.AllocatedDeviceResource{{Vendor: "nvidia", Type: "gpu", Name: "t4", DeviceIDs: []string{"GPU-1"}}}},
		}},
		TaskStates: map[string]*api.TaskState{"task": {State: map[string]string{api.AllocClientStatusComplete: "dead", api.AllocClientStatusFailed: "dead", api.AllocClientStatusLost: "dead"}[status]}},
	}
}

// start runs a watcher against the fake until the test ends, and returns a
// channel of its updates.
func start(t *testing.T, srv *httptest.Server, cfg Config) (*Watcher, <-chan *Snapshot) {
	t.Helper()
	cfg.Address = srv.URL
	w, err := New(cfg, hclog.NewNullLogger())
	must.NoError(t, err)
	w.minBackoff, w.maxBackoff = 20*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	updates := make(chan *Snapshot, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, func(s *Snapshot) {
			select {
			case updates <- s:
			default:
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w, updates
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func status(t *testing.T, w *Watcher, ns, id string) (Verdict, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return w.Status(ctx, ns, id, "task")
}

func TestWatcher_FollowsAllocations(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, _ := start(t, srv, Config{})
	waitFor(t, "first snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })

	id, err := w.NodeID(context.Background())
	must.NoError(t, err)
	must.Eq(t, nodeID, id)
	h := w.Holders("scratch-0")
	must.SliceLen(t, 1, h)
	must.Eq(t, "a1", h[0].Alloc.ID)
	must.Eq(t, "task", h[0].Task)
	must.SliceEmpty(t, w.Holders("GPU-1"), must.Sprint("other vendors' devices are not ours"))
	v, err := status(t, w, "default", "a1")
	must.NoError(t, err)
	must.False(t, v.Ended)

	// The blocking query sees the allocation complete.
	f.set(alloc("a1", "default", "complete", "scratch-0"))
	waitFor(t, "complete", func() bool { v, err := status(t, w, "default", "a1"); return err == nil && v.Ended })
	must.SliceEmpty(t, w.Holders("scratch-0"))
}

func TestWatcher_DesiredStopIsNotEnded(t *testing.T) {
	f, srv := newFake(t)
	a := alloc("a1", "default", "running", "scratch-0")
	a.DesiredStatus = "stop"
	f.set(a)
	w, _ := start(t, srv, Config{})
	waitFor(t, "snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })
	v, err := status(t, w, "default", "a1")
	must.NoError(t, err)
	must.False(t, v.Ended)
	must.True(t, v.Stopping)

	lost := alloc("a2", "default", "lost", "scratch-1")
	lost.TaskStates["task"].State = "running" // lost to the servers, still running here
	f.set(lost)
	waitFor(t, "a2", func() bool { s, _ := w.Snapshot(); return s != nil && s.Allocs["a2"] != nil })
	v, err = status(t, w, "default", "a2")
	must.NoError(t, err)
	must.False(t, v.Ended)
}

func TestWatcher_GarbageCollectedAllocationIsGone(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, _ := start(t, srv, Config{})
	waitFor(t, "snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })
	f.with(func(f *fakeNomad) { f.gone["a1"] = true; f.index++ })
	waitFor(t, "gc", func() bool { s, _ := w.Snapshot(); return s != nil && s.Allocs["a1"] == nil })
	v, err := status(t, w, "default", "a1")
	must.NoError(t, err)
	must.True(t, v.Ended)
	must.StrContains(t, v.Reason, "no longer exists")
}

// Nomad silently drops allocations in namespaces the token cannot read from
// the node's list; the direct, namespace-scoped read answers 403. That must
// mean keep, never gone.
func TestWatcher_TokenLimitedToOneNamespace(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"), alloc("b1", "prod", "running", "scratch-1"))
	f.with(func(f *fakeNomad) { f.hidden["prod"] = true })
	w, _ := start(t, srv, Config{})
	waitFor(t, "snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })
	snap, _ := w.Snapshot()
	must.Eq(t, []string{"a1"}, snap.SortedIDs())

	_, err := status(t, w, "prod", "b1")
	must.ErrorIs(t, err, ErrPermission)
	// Even once the allocation is really gone, a token that cannot see the
	// namespace cannot tell: keep.
	f.with(func(f *fakeNomad) { f.gone["b1"] = true })
	_, err = status(t, w, "prod", "b1")
	must.ErrorIs(t, err, ErrPermission)
	// And with no namespace recorded there is nothing to ask: keep.
	_, err = status(t, w, "", "b1")
	must.ErrorContains(t, err, "namespace is unknown")
}

func TestWatcher_ForbiddenAllocationList(t *testing.T) {
	_, srv := newFake(t)
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Permission denied", http.StatusForbidden)
	}))
	t.Cleanup(forbidden.Close)
	_ = srv
	w, _ := start(t, forbidden, Config{NodeID: nodeID})
	waitFor(t, "an error", func() bool { _, err := w.Snapshot(); return err != nil })
	snap, err := w.Snapshot()
	must.Nil(t, snap)
	must.ErrorIs(t, err, ErrPermission)
	_, err = status(t, w, "default", "a1")
	must.ErrorIs(t, err, ErrPermission)
}

// While the API is down, the last snapshot stays; nothing is reported as
// ended that was not; the watcher catches up when the API is back.
func TestWatcher_APIDownForAWhile(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, _ := start(t, srv, Config{})
	waitFor(t, "snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })
	f.with(func(f *fakeNomad) {
		f.down = 6
		f.allocs = []*api.Allocation{alloc("a1", "default", "complete", "scratch-0")}
		f.index++
	})
	waitFor(t, "an error", func() bool { _, err := w.Snapshot(); return err != nil })
	snap, err := w.Snapshot()
	must.Error(t, err)
	must.NotNil(t, snap, must.Sprint("the last snapshot is kept"))
	waitFor(t, "recovery", func() bool { v, err := status(t, w, "default", "a1"); return err == nil && v.Ended })
}

func TestWatcher_StaleAndDuplicateAnswers(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "complete", "scratch-0"))
	w, updates := start(t, srv, Config{})
	first := <-updates
	must.Eq(t, uint64(11), first.Index)

	// An older answer (a stale follower) showing the allocation running
	// must not replace the newer view.
	f.with(func(f *fakeNomad) {
		f.stale = &staleAnswer{index: 5, allocs: []*api.Allocation{alloc("a1", "default", "running", "scratch-0")}}
	})
	waitFor(t, "the stale answer to be served", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.stale == nil
	})
	time.Sleep(100 * time.Millisecond)
	snap, _ := w.Snapshot()
	must.Eq(t, "complete", snap.Allocs["a1"].ClientStatus)
	must.Eq(t, uint64(11), snap.Index)

	// Repeated answers at the same index call onUpdate no more.
	for len(updates) > 0 {
		<-updates
	}
	time.Sleep(700 * time.Millisecond) // two blocking-query timeouts of the fake
	must.Eq(t, 0, len(updates))
}

func TestWatcher_NodeIDFallsBackToHostname(t *testing.T) {
	f, srv := newFake(t)
	f.with(func(f *fakeNomad) { f.selfCode = http.StatusForbidden })
	w, err := New(Config{Address: srv.URL}, hclog.NewNullLogger())
	must.NoError(t, err)
	id, err := w.NodeID(context.Background())
	must.NoError(t, err)
	must.Eq(t, nodeID, id)

	w, err = New(Config{Address: srv.URL, NodeID: "configured"}, hclog.NewNullLogger())
	must.NoError(t, err)
	id, err = w.NodeID(context.Background())
	must.NoError(t, err)
	must.Eq(t, "configured", id)
}

func TestWatcher_TokenFileReReadWhenChanged(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	tokenFile := filepath.Join(t.TempDir(), "token")
	must.NoError(t, os.WriteFile(tokenFile, []byte("first-token\n"), 0o600))
	w, _ := start(t, srv, Config{TokenFile: tokenFile})
	waitFor(t, "snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })
	must.NoError(t, os.WriteFile(tokenFile, []byte("second-token-longer\n"), 0o600))
	f.set(alloc("a1", "default", "running", "scratch-0"))
	waitFor(t, "the new token", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.tokens[len(f.tokens)-1] == "second-token-longer"
	})
	f.mu.Lock()
	must.SliceContains(t, f.tokens, "first-token")
	f.mu.Unlock()

	_, err := New(Config{Address: srv.URL, TokenFile: filepath.Join(t.TempDir(), "missing")}, hclog.NewNullLogger())
	must.ErrorContains(t, err, "token_file")
	must.True(t, errors.Is(err, os.ErrNotExist))
}

// An owner recorded on another node (the plugin was pointed at another
// cluster) is never judged from this node's view.
func TestWatcher_OwnerFromAnotherNode(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, _ := start(t, srv, Config{})
	waitFor(t, "snapshot", func() bool { s, _ := w.Snapshot(); return s != nil })
	h := w.Holders("scratch-0")
	must.SliceLen(t, 1, h)
	must.Eq(t, nodeID, h[0].NodeID)
	_, err := w.StatusOn(context.Background(), "0ther-node-id", "default", "gone-alloc", "task")
	must.ErrorContains(t, err, "now watches node")
	v, err := w.StatusOn(context.Background(), nodeID, "default", "gone-alloc", "task")
	must.NoError(t, err)
	must.True(t, v.Ended)
}
