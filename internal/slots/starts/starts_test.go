package starts

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// Yield.Wait waits for the starts under way and for nothing else:
// at most its length however many starts begin meanwhile, and not at all
// once hurried, turned off or cancelled.
func TestYield_Wait(t *testing.T) {
	const d = 600 * time.Millisecond
	cases := []struct {
		name string
		d    time.Duration
		// begins are the starts, from the wait's start (negative: before).
		begins []time.Duration
		// during is done 100 ms into the wait.
		during          func(y *Yield, hurry chan struct{}, cancel context.CancelFunc)
		atLeast, atMost time.Duration
	}{
		{name: "no start under way", d: d, atMost: 50 * time.Millisecond},
		{name: "off", d: 0, begins: []time.Duration{0}, atMost: 50 * time.Millisecond},
		{name: "a start under way", d: d, begins: []time.Duration{0}, atLeast: d - 50*time.Millisecond, atMost: d + 300*time.Millisecond},
		{name: "the rest of a start", d: d, begins: []time.Duration{-400 * time.Millisecond}, atLeast: 150 * time.Millisecond, atMost: 400 * time.Millisecond},
		{name: "starts that keep coming", d: d, begins: []time.Duration{0, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}, atLeast: d - 50*time.Millisecond, atMost: d + 300*time.Millisecond},
		{name: "hurried", d: d, begins: []time.Duration{0}, during: func(_ *Yield, h chan struct{}, _ context.CancelFunc) { close(h) }, atLeast: 90 * time.Millisecond, atMost: 350 * time.Millisecond},
		{name: "turned off", d: d, begins: []time.Duration{0}, during: func(y *Yield, _ chan struct{}, _ context.CancelFunc) { y.Set(0) }, atLeast: 90 * time.Millisecond, atMost: 350 * time.Millisecond},
		{name: "cancelled", d: d, begins: []time.Duration{0}, during: func(_ *Yield, _ chan struct{}, c context.CancelFunc) { c() }, atLeast: 90 * time.Millisecond, atMost: 350 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			y := &Yield{}
			y.Set(tc.d)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hurry := make(chan struct{})
			for _, at := range tc.begins {
				if at > 0 {
					time.AfterFunc(at, y.Begin)
					continue
				}
				y.Begin()
				y.mu.Lock()
				y.until = y.until.Add(at)
				y.mu.Unlock()
			}
			if tc.during != nil {
				time.AfterFunc(100*time.Millisecond, func() { tc.during(y, hurry, cancel) })
			}
			waited := y.Wait(ctx, hurry)
			must.GreaterEq(t, tc.atLeast, waited)
			must.LessEq(t, tc.atMost, waited)
		})
	}
}
