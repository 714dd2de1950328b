package hostfs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// TestGet: a call that answers is returned as it came; one that does not
// answer in time is given up (the context's error); while it hangs, every
// call on its path fails at once with ErrStuck and calls on other paths
// run; once it returns, its path is free again. The hanging call is a
// function blocked on a channel: the real fault (a FUSE daemon stopped)
// is TestRoot_AHungFuseDaemonIsABoundedWait in internal/slots.
func TestGet(t *testing.T) {
	bg := context.Background()
	v, err := Get(bg, "/a", func() (int, error) { return 7, nil })
	must.NoError(t, err)
	must.EqOp(t, 7, v)
	boom := errors.New("boom")
	_, err = Get(bg, "/a", func() (int, error) { return 0, boom })
	must.ErrorIs(t, err, boom)

	release := make(chan struct{})
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	v, err = Get(ctx, "/hung", func() (int, error) { <-release; return 1, nil })
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.ErrorContains(t, err, "/hung: no answer from the filesystem")
	must.EqOp(t, 0, v)

	ran := false
	err = Do(bg, "/hung", func() error { ran = true; return nil })
	must.ErrorIs(t, err, ErrStuck)
	err = Do(bg, "/x/../hung/", func() error { ran = true; return nil }) // the same path
	must.ErrorIs(t, err, ErrStuck)
	must.False(t, ran)
	must.NoError(t, Do(bg, "/other", func() error { return nil }))

	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err = Do(bg, "/hung", func() error { return nil })
		if !errors.Is(err, ErrStuck) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	must.NoError(t, err)

	cancelled, cancel2 := context.WithCancel(bg)
	cancel2()
	ranLate := false
	err = Do(cancelled, "/a", func() error { ranLate = true; return nil })
	must.ErrorIs(t, err, context.Canceled)
	must.False(t, ranLate, must.Sprint("ran after its context ended"))
}
