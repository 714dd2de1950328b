package reserve

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// Reserve is the manager's Reserve of ids, which arrived at arrived, from
// the checks of the IDs on; it sets *waited when it had to wait. ps are
// the preparations of ids, all of them when prepared is set (the
// manager's claimPreps).
func (rs *Reserver) Reserve(ctx context.Context, ids []string, arrived time.Time, waited *bool, ps []*preps.Prep, prepared bool) ([]view.Slot, error) {
	if len(ids) == 0 {
		return nil, errors.New("no device IDs to reserve")
	}
	if err := rs.slots.CheckIDs(ids); err != nil {
		return nil, err
	}
	// A slot handed over before the proof of its asker (slots/proof.go) is
	// decided once that proof has answered.
	if err := rs.slots.AwaitProofs(ctx, ids); err != nil {
		return nil, fmt.Errorf("device %s: %w", strings.Join(ids, ", "), err)
	}
	if prepared {
		res, ok, why := rs.work.ReservePrepared(ctx, rs.slots.Nomad(), ids, ps, arrived)
		if ok {
			return res, nil
		}
		rs.log.Debug("prepared slots not handed over at once; the usual proof decides", "devices", ids, "reason", why)
		rs.slots.NoteAsked(arrived)
	}
	// The usual rounds decide from the slots as their preparations left
	// them: a preparation still under way (of some of ids) ends first.
	for _, p := range ps {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
		case <-ctx.Done():
			return nil, fmt.Errorf("device %s: waiting for its preparation: %w", strings.Join(ids, ", "), ctx.Err())
		}
	}
	var read *allocs.View // the latest read that began after arrived
	var why string        // the latest round's reason to wait
	for {
		changed := rs.slots.Changed()
		res, wait, err := rs.try(ctx, ids, arrived, &read)
		if err != nil || wait == "" {
			return res, err
		}
		if ctx.Err() != nil && why != "" {
			// reserve_timeout cut this round short: the reason to tell
			// is the one the round before found (a full pool, say), not
			// the deadline.
			wait = why
		}
		why = wait
		*waited = true
		rs.log.Debug("reserve waiting", "devices", ids, "reason", wait)
		rs.slots.Kick()
		retry := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil, fmt.Errorf("%s; gave up after %s (reserve_timeout)", wait, time.Since(arrived).Round(time.Second))
		case <-changed:
		case <-retry.C:
		}
		retry.Stop()
	}
}
