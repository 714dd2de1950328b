package slots

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
)

// A wait for a slot's lock is logged with what held it and what waited;
// once released, the holder's name is gone; a wait cut by the context
// names the holder in its error; another slot's lock is never waited for.
func TestLockSlot_WaitNamesItsHolder(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: &lockedWriter{w: &buf, mu: &mu}})
	m := NewManager(nil, log)
	ctx := context.Background()

	unlock, err := m.lockSlot(ctx, "scratch-0", "release")
	must.NoError(t, err)

	// Another slot: taken at once, whatever scratch-0's holder does.
	other, err := m.lockSlot(ctx, "scratch-1", "reserve")
	must.NoError(t, err)
	other()

	// Cut by its context: the error names what held the lock.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = m.lockSlot(short, "scratch-0", "reserve")
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.StrContains(t, err.Error(), "(release)")

	got := make(chan error, 1)
	go func() {
		u, err := m.lockSlot(ctx, "scratch-0", "hand over the spare")
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(30 * time.Millisecond)
	unlock()
	must.NoError(t, <-got)

	mu.Lock()
	out := buf.String()
	mu.Unlock()
	must.StrContains(t, out, "waited for the slot's lock")
	must.StrContains(t, out, `for="hand over the spare"`)
	must.StrContains(t, out, "behind=release")
	must.StrNotContains(t, out, "device=scratch-1")
	m.mu.Lock()
	defer m.mu.Unlock()
	must.MapEmpty(t, m.holder)
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
