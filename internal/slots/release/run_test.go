package release

import (
	"context"
	"errors"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
)

// One run per slot: a release joins a release, goes after a spare being
// made, and the slot is free of runs once the run it registered ended.
func TestRuns_OnePerSlot(t *testing.T) {
	for _, tc := range []struct {
		name       string
		first      bool // the first run registered is a release (else a spare)
		joined     bool
		afterFirst bool
	}{
		{name: "a release joins a release", first: true, joined: true},
		{name: "a release goes after a spare", first: false, afterFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewRuns(hclog.NewNullLogger())
			first, created := x.New("scratch-0", tc.first)
			must.True(t, created)
			again, created := x.New("scratch-0", false)
			must.False(t, created)
			must.Eq(t, first, again)
			must.True(t, x.Running("scratch-0"))
			must.False(t, x.Running("scratch-1"))

			r, prev, joined := x.Release("scratch-0")
			must.Eq(t, tc.joined, joined)
			must.Eq(t, tc.afterFirst, prev == first)
			if joined {
				must.Eq(t, first, r)
			}

			// The hurry reaches the run a release goes after.
			r.Hurry()
			r.Hurry() // safe twice
			<-first.Hurried()

			want := errors.New("cut short")
			x.Carry(context.Background(), "scratch-0", r, "release", func(context.Context) error { return want })
			<-r.Done()
			must.ErrorIs(t, r.Err(), want)
			// The release held the slot's place (joined, or taken from
			// the spare's run): it ended, and the slot has no run.
			must.False(t, x.Running("scratch-0"))
		})
	}
}

// Any returns a registered run until none is left.
func TestRuns_Any(t *testing.T) {
	x := NewRuns(hclog.NewNullLogger())
	must.Nil(t, x.Any())
	r, _ := x.New("scratch-1", false)
	must.Eq(t, r, x.Any())
	x.Carry(context.Background(), "scratch-1", r, "making the spare", func(context.Context) error { return nil })
	<-r.Done()
	must.NoError(t, r.Err())
	must.Nil(t, x.Any())
}
