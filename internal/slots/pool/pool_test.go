package pool

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// health answers PoolHealth as a pool in trouble would: states and
// errors a test pool on zfs-fuse cannot be brought to at will.
type health struct {
	state string
	err   error
	reads int
}

func (h *health) PoolHealth(context.Context, string) (string, error) {
	h.reads++
	return h.state, h.err
}

// TestCheck: why the pool cannot be used, named; a check that found it
// ONLINE is trusted by Recent for CheckAge, one that did not is not.
func TestCheck(t *testing.T) {
	cfg := reconcile.Config{Parent: "tank/nomad"}
	cases := []struct {
		name   string
		h      health
		reason string
		// reads is how many reads Check then Recent made.
		reads int
	}{
		{name: "online", h: health{state: "ONLINE"}, reads: 1},
		{name: "degraded", h: health{state: "DEGRADED"}, reason: "pool tank is DEGRADED", reads: 2},
		{name: "not imported", h: health{err: fmt.Errorf("zpool: %w", zfs.ErrNotExist)}, reason: "pool tank is not imported", reads: 2},
		{name: "unreadable", h: health{err: errors.New("timed out")}, reason: "pool tank cannot be read: timed out", reads: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h
			c := New(&h)
			reason, err := c.Check(context.Background(), cfg)
			must.NoError(t, err)
			must.EqOp(t, tc.reason, reason)
			reason, err = c.Recent(context.Background(), cfg)
			must.NoError(t, err)
			must.EqOp(t, tc.reason, reason)
			must.EqOp(t, tc.reads, h.reads)
		})
	}
}

// TestCheck_CutShort: a check cut short by its context says nothing of
// the pool.
func TestCheck_CutShort(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	reason, err := New(&health{state: "ONLINE"}).Check(ctx, reconcile.Config{Parent: "tank/nomad"})
	must.ErrorIs(t, err, context.Canceled)
	must.EqOp(t, "", reason)
}
