package slots_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// hungAPI is allocs behind an API that can hang: while hung, every call
// waits until the test lets it answer or its context is done, as a Nomad
// that accepts connections and never answers makes the plugin's reads do
// (each until its deadline).
type hungAPI struct {
	*allocs
	mu    sync.Mutex
	hung  chan struct{}   // closed to let the waiting calls answer; nil while the API answers
	only  map[string]bool // the methods that hang (all when empty)
	calls atomic.Int32    // calls that found the API hung
}

// hang makes the API's methods named (all when none is) hang until the
// test ends.
func (h *hungAPI) hang(t *testing.T, methods ...string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hung = make(chan struct{})
	h.only = map[string]bool{}
	for _, m := range methods {
		h.only[m] = true
	}
	t.Cleanup(h.answer)
}

// answer lets the calls waiting answer, and the later ones answer at once.
func (h *hungAPI) answer() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hung != nil {
		close(h.hung)
		h.hung = nil
	}
}

// wait returns at once while method answers; while it hangs, when the
// test lets it answer (nil) or when ctx is done (its error).
func (h *hungAPI) wait(ctx context.Context, method string) error {
	h.mu.Lock()
	hung := h.hung
	if len(h.only) > 0 && !h.only[method] {
		hung = nil
	}
	h.mu.Unlock()
	if hung == nil {
		return nil
	}
	h.calls.Add(1)
	select {
	case <-hung:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *hungAPI) View(ctx context.Context, since time.Time) (*slots.View, error) {
	if err := h.wait(ctx, "View"); err != nil {
		return nil, err
	}
	return h.allocs.View(ctx, since)
}

func (h *hungAPI) Latest(ctx context.Context) (*slots.View, error) {
	if err := h.wait(ctx, "Latest"); err != nil {
		return nil, err
	}
	return h.allocs.Latest(ctx)
}

func (h *hungAPI) Holds(ctx context.Context, o record.Owner, ids []string) error {
	if err := h.wait(ctx, "Holds"); err != nil {
		return err
	}
	return h.allocs.Holds(ctx, o, ids)
}

func (h *hungAPI) Incomplete(ctx context.Context) string {
	if err := h.wait(ctx, "Incomplete"); err != nil {
		return "the API did not answer: " + err.Error()
	}
	return h.allocs.Incomplete(ctx)
}

func (h *hungAPI) Gone(ctx context.Context, o record.Owner) (bool, error) {
	if err := h.wait(ctx, "Gone"); err != nil {
		return false, err
	}
	return h.allocs.Gone(ctx, o)
}

// TestRun_AHungAPIHoldsUpNoZFSWork (issue 10): Run's rounds that need
// only ZFS do not wait behind its reads of a hung API. An owner identified
// at Reserve is recorded on ZFS while the preparation of slots and the
// release pass wait for an API that never answers: one identified before
// the API hung, and one identified while the pass waits for the one call
// that hangs (the token's visibility check) and the list still answers.
// So a plugin restarted then still finds the tenant's name on its dataset.
func TestRun_AHungAPIHoldsUpNoZFSWork(t *testing.T) {
	cases := []struct {
		name string
		hang []string // the methods that hang (every one when empty)
		// late: the Reserve comes once Run's pass waits for the API.
		late bool
	}{
		{name: "every call hangs, owner identified before"},
		{name: "the pass's visibility check hangs, owner identified meanwhile", hang: []string{"Incomplete"}, late: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, a := newReleaseEnv(t, 2)
			h := &hungAPI{allocs: a}
			e.mgr.SetNomad(h)
			o := owner(80)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var ds string
			reserve := func() {
				t.Helper()
				// Placed as it asks: no preparation (a Reserve under way
				// has none started), so Run's owner loop records it.
				a.hold("scratch-0", o)
				res, err := e.mgr.Reserve(context.Background(), []string{"scratch-0"})
				must.NoError(t, err)
				a.start(o)
				ds = res[0].Dataset
			}
			if !tc.late {
				reserve()
				must.NoError(t, e.mgr.Wait(context.Background())) // the spare made behind it
				must.Eq(t, "", e.pool.Prop(t, ds, record.PropOwner), must.Sprint("identified, not recorded yet: Run records it"))
			}

			h.hang(t, tc.hang...)
			go e.mgr.Run(ctx, time.Hour)
			e.mgr.Kick()
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return h.calls.Load() > 0 }),
				wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)), must.Sprint("Run reads the hung API"))
			if tc.late {
				reserve()
			}
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
				return e.pool.Prop(t, ds, record.PropOwner) != ""
			}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Sprint("the owner is recorded while the API hangs"))
			must.Eq(t, o, recordedOwner(t, e, ds))
		})
	}
}

// cachedAllocs is allocs behind a cache, as the watcher serves views: a
// View whose since is no later than the cached read's start is answered
// from the cache; otherwise it is a new read, cached.
type cachedAllocs struct {
	*allocs
	mu     sync.Mutex
	cached *slots.View
	reads  int         // new reads
	sinces []time.Time // every since asked for
}

func (c *cachedAllocs) View(ctx context.Context, since time.Time) (*slots.View, error) {
	c.mu.Lock()
	c.sinces = append(c.sinces, since)
	if c.cached != nil && !c.cached.Began.Before(since) {
		v := c.cached
		c.mu.Unlock()
		return v, nil
	}
	c.reads++
	c.mu.Unlock()
	v, err := c.allocs.View(ctx, since)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.cached = v
	c.mu.Unlock()
	return v, nil
}

func (c *cachedAllocs) counts() (reads int, latest time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sinces {
		if s.After(latest) {
			latest = s
		}
	}
	return c.reads, latest
}

// A pass that a kick starts decides from the latest read only when that
// read began after the latest Reserve arrived and no reserved slot's owner
// is unknown: a read from before shows no holder of a device just handed
// out, and a read that misses the holder (made under a token since
// widened) would have an owner never identified taken for gone. Otherwise
// a newer read is reused, not read again.
func TestRun_KickedPassDecidesFromNoReadOlderThanTheLatestReserve(t *testing.T) {
	e := newEnv(t, 2)
	a := &cachedAllocs{allocs: newAllocs()}
	e.mgr.SetNomad(a)
	e.sync(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.mgr.Run(ctx, time.Hour)
	asked := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.sinces)
	}
	// kick kicks a pass and waits until it has asked for a view (or
	// archived something) and the work it started is done.
	kick := func() {
		t.Helper()
		n := asked()
		e.mgr.Kick()
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			return asked() > n || len(archived(t, e)) > 0
		}), wait.Timeout(30*time.Second), wait.Gap(20*time.Millisecond)), must.Sprint("the kicked pass asks for a view"))
		must.NoError(t, e.mgr.Wait(ctx))
	}

	// Known owners only: a read newer than the latest Reserve is reused.
	p := owner(41)
	sp := reserveAndWrite(t, e, a.allocs, "scratch-1", p)
	_, err := a.View(ctx, time.Now())
	must.NoError(t, err)
	reads, _ := a.counts()
	kick()
	after, _ := a.counts()
	must.Eq(t, reads, after, must.Sprint("a read that began after the latest Reserve is reused"))

	// A read from before the next Reserve: nothing holds scratch-0.
	_, err = a.View(ctx, time.Now())
	must.NoError(t, err)
	// o is handed the fresh slot while the API fails: its owner is never
	// identified. o writes.
	o := owner(40)
	a.hold("scratch-0", o)
	a.setErr(errors.New("connection refused"))
	arrived := time.Now()
	res, err := e.mgr.Reserve(ctx, []string{"scratch-0"})
	must.NoError(t, err)
	a.start(o)
	must.NoError(t, os.WriteFile(filepath.Join(res[0].Mountpoint, "data.txt"), []byte("o's"), 0o644))
	guid := e.guid(t, res[0].Dataset)
	must.NoError(t, e.mgr.Wait(ctx))
	a.setErr(nil)
	kick()
	must.SliceEmpty(t, archived(t, e), must.Sprint("o's data was taken for no one's"))
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	must.StrContains(t, slotByID(t, e, "scratch-0").HealthDesc, "owner unknown")
	_, latest := a.counts()
	must.False(t, latest.Before(arrived), must.Sprint("the kicked pass asked for a read that began after the Reserve"))

	// A read after the Reserve that misses o (as one made under a token
	// that could not see o's namespace would): the pass reads anew.
	a.mu.Lock()
	a.allocs.mu.Lock()
	a.allocs.holders["scratch-0"] = nil
	a.allocs.mu.Unlock()
	a.mu.Unlock()
	_, err = a.View(ctx, time.Now())
	must.NoError(t, err)
	a.hold("scratch-0", o)
	kick()
	must.SliceEmpty(t, archived(t, e), must.Sprint("o's data was taken for no one's"))
	must.Eq(t, guid, e.guid(t, res[0].Dataset))
	must.Eq(t, sp.Dataset, slotByID(t, e, "scratch-1").Dataset)
}
