package slots_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

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

func (h *hungAPI) Holds(ctx context.Context, o slots.Owner, ids []string) error {
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

func (h *hungAPI) Gone(ctx context.Context, o slots.Owner) (bool, error) {
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
				must.Eq(t, "", e.pool.Prop(t, ds, slots.PropOwner), must.Sprint("identified, not recorded yet: Run records it"))
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
				return e.pool.Prop(t, ds, slots.PropOwner) != ""
			}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Sprint("the owner is recorded while the API hangs"))
			must.Eq(t, o, recordedOwner(t, e, ds))
		})
	}
}
