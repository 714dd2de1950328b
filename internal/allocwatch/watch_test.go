package allocwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	requests []string        // path and query of each request
	accepts  []string        // Accept-Encoding of each request
	// gate, when set, holds every read of the node's allocations until it
	// is closed.
	gate chan struct{}
	// changed is closed (and replaced) at every change of the state above,
	// waking the blocking queries that wait for one.
	changed chan struct{}
}

// staleAnswer is an old answer, as a lagging server would give.
type staleAnswer struct {
	index  uint64
	allocs []*api.Allocation
}

const nodeID = "f1e2d3c4-0000-0000-0000-000000000000"

func newFake(t *testing.T) (*fakeNomad, *httptest.Server) {
	t.Helper()
	f := &fakeNomad{index: 10, gone: map[string]bool{}, hidden: map[string]bool{}, changed: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeNomad) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.tokens = append(f.tokens, r.Header.Get("X-Nomad-Token"))
	f.requests = append(f.requests, r.URL.RequestURI())
	f.accepts = append(f.accepts, r.Header.Get("Accept-Encoding"))
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

// fakeWait is how long the fake holds a blocking query with nothing new
// before it answers at the same index, as Nomad does at its wait time.
const fakeWait = 300 * time.Millisecond

// nodeAllocs answers the node's allocation list as a blocking query: at once
// when the index is past the client's, or a stale answer is set; otherwise
// at the next change, or at the same index after fakeWait.
func (f *fakeNomad) nodeAllocs(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	wait, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	timeout := time.NewTimer(fakeWait)
	defer timeout.Stop()
	for {
		f.mu.Lock()
		if f.stale != nil {
			old := f.stale
			f.stale = nil
			f.changedLocked()
			f.mu.Unlock()
			writeJSON(w, old.index, old.allocs)
			return
		}
		if f.index > wait {
			out, idx := f.visibleLocked(), f.index
			f.mu.Unlock()
			writeJSON(w, idx, out)
			return
		}
		changed := f.changed
		f.mu.Unlock()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-timeout.C:
			f.mu.Lock()
			out, idx := f.visibleLocked(), f.index
			f.mu.Unlock()
			writeJSON(w, idx, out)
			return
		}
	}
}

// changedLocked wakes every blocking query waiting for a change.
func (f *fakeNomad) changedLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// nodeReads is how many requests for the node's allocation list the fake
// has received so far.
func (f *fakeNomad) nodeReads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, uri := range f.requests {
		if path, _, _ := strings.Cut(uri, "?"); path == "/v1/node/"+nodeID+"/allocations" {
			n++
		}
	}
	return n
}

// visibleLocked filters out allocations in namespaces the token cannot
// read, silently, as Nomad does.
// visibleLocked is the node's allocation list as the token sees it; never
// nil, so that it encodes as [] as Nomad's answer does (null is refused).
func (f *fakeNomad) visibleLocked() []*api.Allocation {
	out := []*api.Allocation{}
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
	f.changedLocked()
}

func (f *fakeNomad) with(fn func(f *fakeNomad)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
	f.changedLocked()
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
// channel of its updates. Each of opts changes the watcher before it runs.
func start(t *testing.T, srv *httptest.Server, cfg Config, opts ...func(*Watcher)) (*Watcher, <-chan *Snapshot) {
	t.Helper()
	cfg.Address = srv.URL
	w, err := New(cfg, hclog.NewNullLogger())
	must.NoError(t, err)
	w.minBackoff, w.maxBackoff = 20*time.Millisecond, 100*time.Millisecond
	for _, o := range opts {
		o(w)
	}
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

// waitFor polls cond every 10 ms until it holds, and fails the test when it
// does not within 10 s.
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

// next returns the watcher's next update, and fails the test when none
// comes within 10 s.
func next(t *testing.T, updates <-chan *Snapshot) *Snapshot {
	t.Helper()
	select {
	case s := <-updates:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("no update from the watcher within 10s")
		return nil
	}
}

// waitReads waits until the fake has received n more requests for the
// node's allocations than it had when waitReads was called. The watcher
// reads one at a time and handles each answer before it asks again, so once
// it has asked n more times, it has handled at least n-1 answers given
// after the call.
func waitReads(t *testing.T, f *fakeNomad, n int) {
	t.Helper()
	want := f.nodeReads() + n
	waitFor(t, fmt.Sprintf("%d more reads of the node's allocations", n), func() bool { return f.nodeReads() >= want })
}

// waitSnapshot waits until the watcher's latest snapshot satisfies cond, and
// returns it.
func waitSnapshot(t *testing.T, w *Watcher, what string, cond func(*Snapshot) bool) *Snapshot {
	t.Helper()
	var snap *Snapshot
	waitFor(t, what, func() bool {
		snap, _ = w.Snapshot()
		return snap != nil && cond(snap)
	})
	return snap
}

// anySnap accepts any snapshot.
func anySnap(*Snapshot) bool { return true }

// gone calls Gone with a 5 s deadline.
func gone(t *testing.T, w *Watcher, ns, id string) (bool, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return w.Gone(ctx, ns, id, "task")
}

func TestWatcher_FollowsAllocations(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, _ := start(t, srv, Config{})
	snap := waitSnapshot(t, w, "first snapshot", anySnap)

	id, err := w.NodeID(context.Background())
	must.NoError(t, err)
	must.Eq(t, nodeID, id)
	a := snap.Allocs["a1"]
	must.NotNil(t, a)
	must.Eq(t, map[string]string{"scratch-0": "task"}, a.Devices, must.Sprint("other vendors' devices are not ours"))
	must.False(t, a.Ended("task"))

	// The blocking query sees the allocation complete.
	f.set(alloc("a1", "default", "complete", "scratch-0"))
	waitSnapshot(t, w, "complete", func(s *Snapshot) bool { return s.Allocs["a1"] != nil && s.Allocs["a1"].Ended("task") })
	// And its garbage collection; then it is positively gone.
	f.with(func(f *fakeNomad) { f.gone["a1"] = true; f.index++ })
	waitSnapshot(t, w, "gc", func(s *Snapshot) bool { return s.Allocs["a1"] == nil })
	g, err := gone(t, w, "default", "a1")
	must.NoError(t, err)
	must.True(t, g)

	// Every read is consistent: none asks for a stale answer.
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, uri := range f.requests {
		u, err := url.ParseRequestURI(uri)
		must.NoError(t, err)
		must.MapNotContainsKey(t, u.Query(), "stale", must.Sprint(uri))
	}
}

// Under a stream of changes (a churn of short jobs changes some allocation
// every few milliseconds), the watcher reads the list at most once per
// readGap after a change, and still follows it: the last change is seen.
// Without the gap it reads once per change.
func TestWatcher_ReadsAtMostOncePerGapWhileChanging(t *testing.T) {
	const busy = time.Second
	for _, tc := range []struct {
		name string
		gap  time.Duration
		// atMost and atLeast bound the reads during busy.
		atMost, atLeast int
	}{
		{name: "gap", gap: 100 * time.Millisecond, atMost: int(busy/(100*time.Millisecond)) + 2, atLeast: 2},
		{name: "no gap", gap: 0, atMost: 1 << 30, atLeast: 3 * (int(busy/(100*time.Millisecond)) + 2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFake(t)
			f.set(alloc("a1", "default", "running", "scratch-0"))
			w, _ := start(t, srv, Config{}, func(w *Watcher) { w.readGap = tc.gap })
			waitSnapshot(t, w, "first snapshot", anySnap)
			before := f.nodeReads()
			for end := time.Now().Add(busy); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
				f.with(func(f *fakeNomad) { f.index++ })
			}
			reads := f.nodeReads() - before
			f.set(alloc("a1", "default", "complete", "scratch-0"))
			waitSnapshot(t, w, "the last change", func(s *Snapshot) bool { return s.Allocs["a1"] != nil && s.Allocs["a1"].Ended("task") })
			t.Logf("%d reads in %s of changes", reads, busy)
			must.LessEq(t, tc.atMost, reads)
			must.GreaterEq(t, tc.atLeast, reads)
		})
	}
}

// A read that changed who holds the plugin's devices (an allocation placed
// on one, ended, told to stop) is followed by the next read at once, not
// after readGap: the next holder of a device whose holder ended is placed
// right behind the end, and the slot manager prepares its slot before its
// task asks. A change that leaves the holders as they were waits for the
// gap.
func TestWatcher_NoGapAfterAChangeOfHolders(t *testing.T) {
	const gap = 2 * time.Second
	a1 := alloc("a1", "default", "running", "scratch-0")
	cases := []struct {
		name  string
		first func(f *fakeNomad) // the change read first
		fast  bool               // the change after it is seen within the gap
	}{
		{name: "placed", first: func(f *fakeNomad) {
			f.allocs = append(f.allocs, alloc("a2", "default", "pending", "scratch-1"))
			f.index++
		}, fast: true},
		{name: "ended", first: func(f *fakeNomad) {
			f.allocs = []*api.Allocation{alloc("a1", "default", "complete", "scratch-0")}
			f.index++
		}, fast: true},
		{name: "told to stop", first: func(f *fakeNomad) {
			a := alloc("a1", "default", "running", "scratch-0")
			a.DesiredStatus = api.AllocDesiredStatusStop
			f.allocs = []*api.Allocation{a}
			f.index++
		}, fast: true},
		{name: "task event only", first: func(f *fakeNomad) { f.index++ }},
		{name: "another vendor's device", first: func(f *fakeNomad) {
			f.allocs = append(f.allocs, alloc("a3", "default", "pending"))
			f.index++
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFake(t)
			f.set(a1)
			w, _ := start(t, srv, Config{}, func(w *Watcher) { w.readGap = gap })
			waitSnapshot(t, w, "first snapshot", anySnap)
			// The first read changed the holders (from none): the next
			// one follows at once and waits for a change.
			time.Sleep(300 * time.Millisecond)
			f.with(tc.first)
			waitSnapshot(t, w, "the first change", func(s *Snapshot) bool { return s.Index == 12 })
			time.Sleep(50 * time.Millisecond)
			f.with(func(f *fakeNomad) { f.index++ })
			began := time.Now()
			waitSnapshot(t, w, "the change after it", func(s *Snapshot) bool { return s.Index == 13 })
			took := time.Since(began)
			t.Logf("the change after it seen in %s", took.Round(time.Millisecond))
			if tc.fast {
				must.Less(t, gap/2, took)
			} else {
				must.Greater(t, gap/2, took)
			}
		})
	}
}

// Nomad silently drops allocations in namespaces the token cannot read from
// the node's list; the namespace-scoped list answers 403. That must mean
// keep, never gone.
func TestWatcher_TokenLimitedToOneNamespace(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"), alloc("b1", "prod", "running", "scratch-1"))
	f.with(func(f *fakeNomad) { f.hidden["prod"] = true })
	w, _ := start(t, srv, Config{})
	snap := waitSnapshot(t, w, "snapshot", anySnap)
	must.Eq(t, []string{"a1"}, snap.SortedIDs())

	_, err := gone(t, w, "prod", "b1")
	must.ErrorIs(t, err, ErrPermission)
}

func TestWatcher_ForbiddenAllocationList(t *testing.T) {
	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Permission denied", http.StatusForbidden)
	}))
	t.Cleanup(forbidden.Close)
	w, _ := start(t, forbidden, Config{NodeID: nodeID})
	waitFor(t, "an error", func() bool { _, err := w.Snapshot(); return err != nil })
	snap, err := w.Snapshot()
	must.Nil(t, snap)
	must.ErrorIs(t, err, ErrPermission)
	_, err = gone(t, w, "default", "a1")
	must.ErrorIs(t, err, ErrPermission)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = w.Fresh(ctx, time.Now())
	must.ErrorIs(t, err, ErrPermission)
}

// While the API is down, the last snapshot stays; the watcher catches up
// when the API is back.
func TestWatcher_APIDownForAWhile(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, _ := start(t, srv, Config{})
	waitSnapshot(t, w, "snapshot", anySnap)
	f.with(func(f *fakeNomad) {
		f.down = 6
		f.allocs = []*api.Allocation{alloc("a1", "default", "complete", "scratch-0")}
		f.index++
	})
	waitFor(t, "an error", func() bool { _, err := w.Snapshot(); return err != nil })
	snap, err := w.Snapshot()
	must.Error(t, err)
	must.NotNil(t, snap, must.Sprint("the last snapshot is kept"))
	waitSnapshot(t, w, "recovery", func(s *Snapshot) bool { return s.Allocs["a1"].Ended("task") })
}

func TestWatcher_StaleAndDuplicateAnswers(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "complete", "scratch-0"))
	w, updates := start(t, srv, Config{})
	first := next(t, updates)
	must.Eq(t, uint64(11), first.Index)

	// An older answer (a stale follower) showing the allocation running
	// must not replace the newer view. The watcher then reads afresh (from
	// index 0) and may report index 11 again; two more reads prove it has
	// handled both the stale answer and that fresh one.
	f.with(func(f *fakeNomad) {
		f.stale = &staleAnswer{index: 5, allocs: []*api.Allocation{alloc("a1", "default", "running", "scratch-0")}}
	})
	waitFor(t, "the stale answer to be served", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.stale == nil
	})
	waitReads(t, f, 2)
	snap, _ := w.Snapshot()
	must.Eq(t, "complete", snap.Allocs["a1"].ClientStatus)
	must.Eq(t, uint64(11), snap.Index)
	for len(updates) > 0 {
		u := <-updates
		must.Eq(t, uint64(11), u.Index, must.Sprint("the stale answer reached onUpdate"))
		must.Eq(t, "complete", u.Allocs["a1"].ClientStatus)
	}

	// Repeated answers at the same index call onUpdate no more: after two
	// more reads, at least one answer at the same index (the fake's wait
	// ran out with nothing new) has been handled, without an update.
	waitReads(t, f, 2)
	must.Eq(t, 0, len(updates))
}

// The api package asks for gzip on every request; the watcher's reads go
// out without it (plainAnswers), so the agent does not compress the node's
// allocation list at every change.
func TestWatcher_AsksForPlainAnswers(t *testing.T) {
	f, srv := newFake(t)
	f.set(alloc("a1", "default", "running", "scratch-0"))
	w, updates := start(t, srv, Config{})
	must.Eq(t, "running", next(t, updates).Allocs["a1"].ClientStatus)
	_, err := w.Fresh(t.Context(), time.Now())
	must.NoError(t, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	must.SliceNotEmpty(t, f.accepts)
	for i, enc := range f.accepts {
		must.Eq(t, "", enc, must.Sprint("request ", f.requests[i]))
	}
}

func TestWatcher_NodeIDFallsBackToHostname(t *testing.T) {
	f, srv := newFake(t)
	w, err := New(Config{Address: srv.URL}, hclog.NewNullLogger())
	must.NoError(t, err)
	id, err := w.NodeID(context.Background())
	must.NoError(t, err)
	must.Eq(t, nodeID, id, must.Sprint("from /v1/agent/self"))

	f.with(func(f *fakeNomad) { f.selfCode = http.StatusForbidden })
	w, err = New(Config{Address: srv.URL}, hclog.NewNullLogger())
	must.NoError(t, err)
	id, err = w.NodeID(context.Background())
	must.NoError(t, err)
	must.Eq(t, nodeID, id, must.Sprint("from the node named after this host"))

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
	waitSnapshot(t, w, "snapshot", anySnap)
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

// TestConvert checks what an API allocation becomes, through the JSON the
// API sends: only the plugin's
// devices, which tasks are dead or have started, and when it has ended.
func TestConvert(t *testing.T) {
	withTask := func(status, desired string, ts *api.TaskState) *api.Allocation {
		a := alloc("a1", "default", status, "scratch-0")
		a.DesiredStatus = desired
		a.TaskStates = map[string]*api.TaskState{"task": ts, "nil": nil}
		return a
	}
	cases := []struct {
		name            string
		in              *api.Allocation
		ended, stopping bool
		dead, started   bool
		wantDevs        map[string]string
	}{
		{name: "running", in: withTask("running", "run", &api.TaskState{State: "running"}), started: true},
		{name: "pending, not started", in: withTask("pending", "run", &api.TaskState{State: "pending"})},
		{name: "restarting, started before", in: withTask("pending", "run", &api.TaskState{State: "pending", StartedAt: time.Unix(1, 0)}), started: true},
		{name: "desired stop", in: withTask("running", "stop", &api.TaskState{State: "running"}), stopping: true, started: true},
		{name: "desired evict", in: withTask("running", "evict", &api.TaskState{State: "running"}), stopping: true, started: true},
		{name: "complete", in: withTask("complete", "run", &api.TaskState{State: "dead", StartedAt: time.Unix(1, 0)}), ended: true, dead: true, started: true},
		{name: "failed before start", in: withTask("failed", "run", &api.TaskState{State: "dead"}), ended: true, dead: true},
		// Nomad reports an allocation failed as soon as one task fails;
		// its poststop task (here the device's holder) runs after that.
		{name: "failed, the holding task yet to run", in: withTask("failed", "run", &api.TaskState{State: "pending"})},
		{name: "failed, the holding task running", in: withTask("failed", "run", &api.TaskState{State: "running"}), started: true},
		{name: "lost, task running", in: withTask("lost", "stop", &api.TaskState{State: "running"}), stopping: true, started: true},
		{name: "lost, task dead", in: withTask("lost", "stop", &api.TaskState{State: "dead"}), ended: true, stopping: true, dead: true},
		{name: "no resources", in: &api.Allocation{ID: "a1", ClientStatus: "running"}, wantDevs: map[string]string{}},
		{name: "nil task resources and devices", in: &api.Allocation{ID: "a1", ClientStatus: "running",
			AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{
				"a": nil, "b": {Devices: []*api.AllocatedDeviceResource{nil}}}}}, wantDevs: map[string]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// What the watcher decodes from the API's JSON of the
			// allocation, as a real answer carries it.
			b, err := json.Marshal(tc.in)
			must.NoError(t, err)
			var lean leanAlloc
			must.NoError(t, json.Unmarshal(b, &lean))
			a := convert(&lean)
			want := tc.wantDevs
			if want == nil {
				want = map[string]string{"scratch-0": "task"}
			}
			must.Eq(t, want, a.Devices)
			must.EqOp(t, tc.ended, a.Ended("task"))
			if tc.in.ClientStatus == "lost" {
				must.False(t, a.Ended("other-task"), must.Sprint("a lost allocation has ended only for its dead tasks"))
			}
			must.EqOp(t, tc.stopping, a.Stopping)
			must.EqOp(t, tc.dead, a.DeadTasks["task"])
			must.EqOp(t, tc.started, a.StartedTasks["task"])
		})
	}
}
