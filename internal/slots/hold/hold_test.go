package hold

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// TestHolds: a slot is held from the first time its owner's end is seen,
// for the hold's length and no longer; a new owner starts a new hold; the
// kick comes once, at the end of the hold.
func TestHolds(t *testing.T) {
	const d = 200 * time.Millisecond
	cases := []struct {
		name string
		// steps are the calls of Hold, at their offsets from the first.
		steps []step
		// holdingAfter is, after the steps, whether the slot is held for
		// owner "a"; kicks is how many kicks came within 2d of the first.
		holdingAfter bool
		kicks        int
	}{
		{name: "seen once: held, kicked at the end", steps: []step{{owner: "a", ok: true, first: true}}, holdingAfter: true, kicks: 1},
		{name: "seen again within the hold: still held, not first, one kick",
			steps: []step{{owner: "a", ok: true, first: true}, {at: d / 2, owner: "a", ok: true}}, holdingAfter: true, kicks: 1},
		{name: "seen again after the hold: released",
			steps: []step{{owner: "a", ok: true, first: true}, {at: d + 50*time.Millisecond, owner: "a"}}, kicks: 1},
		{name: "another owner: a new hold",
			steps: []step{{owner: "a", ok: true, first: true}, {at: d / 2, owner: "b", ok: true, first: true}}, kicks: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hs := New()
			hs.Set(d)
			must.EqOp(t, d, hs.Duration())
			kicks := make(chan struct{}, 10)
			start := time.Now()
			for _, st := range tc.steps {
				time.Sleep(time.Until(start.Add(st.at)))
				ok, first := hs.Hold("scratch-0", st.owner, func() { kicks <- struct{}{} })
				must.EqOp(t, st.ok, ok, must.Sprintf("held at %s", st.at))
				must.EqOp(t, st.first, first, must.Sprintf("first at %s", st.at))
			}
			must.EqOp(t, tc.holdingAfter, hs.Holding("scratch-0", "a"))
			if tc.holdingAfter {
				must.True(t, hs.Holding("scratch-0", ""), must.Sprint("any owner's hold counts with owner \"\""))
				must.False(t, hs.Holding("scratch-1", ""), must.Sprint("another slot is not held"))
			}
			time.Sleep(time.Until(start.Add(2 * d)))
			must.EqOp(t, tc.kicks, len(kicks))
		})
	}
}

type step struct {
	at        time.Duration
	owner     string
	ok, first bool
}
