package proofs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// TestGates: a gate closes its slots until it is opened, a later gate on
// a slot is not opened by an earlier one's Open, and Await waits for the
// slots asked (every slot for nil) until its context is done.
func TestGates(t *testing.T) {
	g := New(2 * time.Second)
	must.Eq(t, 2*time.Second, g.Grace())
	g.SetGrace(time.Second)
	must.Eq(t, time.Second, g.Grace())

	first := g.Close([]string{"a-0", "a-1"})
	must.True(t, g.Under("a-0"))
	must.True(t, g.Under("a-1"))
	must.False(t, g.Under("a-2"))
	must.Nil(t, g.Of("a-2"))
	second := g.Close([]string{"a-1"}) // a later proof on a-1

	for _, tc := range []struct {
		name string
		ids  []string
		want bool // waits
	}{
		{"a slot with no proof", []string{"a-2"}, false},
		{"a slot under a proof", []string{"a-2", "a-0"}, true},
		{"every slot", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			err := g.Await(ctx, tc.ids)
			if tc.want {
				must.True(t, errors.Is(err, context.DeadlineExceeded))
			} else {
				must.NoError(t, err)
			}
		})
	}

	g.Open([]string{"a-0", "a-1"}, first)
	<-first // closed: its waiters go on
	must.False(t, g.Under("a-0"))
	must.True(t, g.Under("a-1")) // still the second proof's
	must.NoError(t, g.Await(context.Background(), []string{"a-0"}))

	done := make(chan error, 1)
	go func() { done <- g.Await(context.Background(), nil) }()
	g.Open([]string{"a-1"}, second)
	must.NoError(t, <-done)
	must.False(t, g.Under("a-1"))
}
