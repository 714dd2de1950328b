package reserve

// Reserve on fresh slots: the one zfs command of each, and who asked.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// fresh marks fresh slots reserved (one zfs command each), hands
// over the spares of held slots (package spare's HandOver: in memory for an armed
// spare, the old dataset's fate behind it), and, while that runs, reads
// who holds them. It returns once the
// slots are reserved and the read is done, or IdentifyGrace after the zfs
// work when it is not: an identification only counts from a read that
// began after the call arrived and ended before the dataset was handed
// over, when no tenant can have written to it yet. A spare that cannot be
// handed over (the slot changed since it was seen, or ZFS refused) is a
// Retry error; the slots handed over before a failure are
// identified all the same.
func (rs *Reserver) fresh(ctx context.Context, nomad allocs.Nomad, ids []string, spares []view.Slot, arrived time.Time, have *allocs.View) ([]view.Slot, error) {
	if len(ids) == 0 && len(spares) == 0 {
		return nil, nil
	}
	type read struct {
		v   *allocs.View
		err error
	}
	got := make(chan read, 1)
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	switch {
	case have != nil:
		got <- read{v: have}
	case nomad == nil:
		got <- read{err: errors.New("no Nomad API configured")}
	default:
		go func() {
			v, err := nomad.View(ictx, arrived)
			got <- read{v, err}
		}()
	}

	var out []view.Slot
	how := map[string]string{}
	// released: how many releases of each slot may have begun by the end
	// of its handover (a spare's handover begins the old dataset's);
	// another one since, and the read no longer speaks of what serves.
	released := map[string]uint64{}
	// failed: a handover that failed. The slots handed over before it are
	// still identified below, so that the next round, which finds them
	// reserved, gives them back to their owner (the asker) rather than
	// keep them for want of one.
	var failed error
	for _, held := range spares {
		released[held.ID] = rs.slots.ReleasesOf(held.ID) + 1
		s, err := rs.work.HandOverSpare(ctx, held, record.Owner{})
		if err != nil {
			failed = Retry{fmt.Errorf("device %s: handing over its spare: %w", held.ID, err)}
			break
		}
		out = append(out, s)
		how[s.ID] = "spare"
	}
	for _, id := range ids {
		if failed != nil {
			break
		}
		released[id] = rs.slots.ReleasesOf(id)
		s, err := rs.work.MarkReserved(ctx, id)
		if err != nil {
			failed = err
			break
		}
		out = append(out, s)
		how[id] = "fresh"
	}
	if len(out) == 0 {
		return nil, failed
	}

	var r read
	grace := time.NewTimer(IdentifyGrace)
	defer grace.Stop()
	select {
	case r = <-got:
	case <-grace.C:
		r.err = fmt.Errorf("no allocation read within %s", IdentifyGrace)
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	for i, s := range out {
		var why string
		switch {
		case r.err != nil:
			why = fmt.Sprintf("the node's allocations could not be read when it was reserved (%v)", r.err)
		case !r.v.Complete:
			rs.slots.SetIncomplete(r.v.Incomplete)
			why = "the token may not see every namespace (see the warning), so the sole visible holder is no proof of who asked"
		default:
			rs.slots.SetIncomplete(r.v.Incomplete)
			h := r.v.Holders(s.ID)
			switch {
			case len(h) == 1:
				out[i].Owner = h[0].Owner
			case len(h) == 0:
				why = "no allocation holds it in the read made for this Reserve"
			default:
				why = fmt.Sprintf("%d live allocations hold it", len(h))
			}
		}
		if !rs.slots.Identified(s, released[s.ID], out[i].Owner, why) {
			// Released since it was handed over (its asker ended before
			// the read came back), and perhaps another tenant's since:
			// what the read says belongs to a dataset that no longer
			// serves, and is not recorded on the one that does.
			rs.log.Warn("reserved slot changed before the read that identifies its asker came back", "device", s.ID, "dataset", s.Dataset)
			if failed == nil {
				failed = fmt.Errorf("device %s: its dataset %s was released before the read that identifies the asker came back", s.ID, s.Dataset)
			}
			continue
		}
		if why != "" {
			rs.log.Warn("reserved slot's owner unknown", "device", s.ID, "reason", why)
		}
		rs.log.Info("slot reserved", "device", s.ID, "dataset", s.Dataset, "owner", out[i].Owner.String(), "how", how[s.ID], "took", time.Since(arrived))
	}
	rs.slots.Kick() // record owners in the background, off Reserve's path
	for _, s := range out {
		rs.work.GoTend(ctx, s.ID) // the spare, for the next tenant
	}
	if failed != nil {
		return nil, failed
	}
	return out, nil
}
