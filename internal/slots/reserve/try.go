package reserve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/restore"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// decidedRelease is a release that Reserve starts: the slot, and the
// allocation asking for it.
type decidedRelease struct {
	slot  view.Slot
	asker record.Owner
}

// try reserves the slots if that is safe now. Otherwise it starts
// what it can (the release of a slot whose owner has ended) and returns why
// the caller must wait. *read caches the allocation read of this round.
func (rs *Reserver) try(ctx context.Context, ids []string, arrived time.Time, read **allocs.View) (res []view.Slot, wait string, err error) {
	nomad := rs.slots.Nomad()
	var fresh []string
	var spares []view.Slot // held slots: their spare goes to the asker as a fresh slot does
	var release []decidedRelease
	// renew: the wait is for something outside this plugin, so the next
	// round needs a new read. A wait for releases only keeps the read: it
	// began after the call arrived, which is all its proofs need.
	renew := false
	defer func() {
		if renew {
			*read = nil
		}
	}()
	for _, id := range ids {
		s, ok := rs.slots.Slot(id)
		if !ok {
			return nil, "", fmt.Errorf("device %s is no longer offered by this node", id)
		}
		if s.State == record.StateFree {
			if !s.OK || s.Mountpoint == "" {
				return nil, "", fmt.Errorf("device %s (dataset %s) cannot be reserved: %s", s.ID, s.Dataset, s.Why)
			}
			fresh = append(fresh, id)
			continue
		}
		if s.State == record.StateReleasing || s.State == record.StateDestroying {
			wait = fmt.Sprintf("device %s is being released from %s", s.ID, s.Owner)
			continue
		}
		if s.State != record.StateReserved || s.Unreadable {
			return nil, "", fmt.Errorf("device %s (dataset %s) cannot be reserved: %s", s.ID, s.Dataset, s.Why)
		}
		if rs.slots.HeldForNext(s) {
			// A release pass found its owner ended ("ended" never goes
			// back) and left the slot, its spare ready, to its next
			// tenant (spareHold): the spare is handed over as a fresh
			// slot is.
			spares = append(spares, s)
			continue
		}
		// A slot a tenant may have written: proof first.
		if nomad == nil {
			wait, renew = fmt.Sprintf("device %s holds the data of %s and this plugin cannot read allocations to verify the asker", s.ID, s.Owner), true
			continue
		}
		if *read == nil {
			v, err := nomad.View(ctx, arrived)
			if err != nil {
				wait = fmt.Sprintf("device %s holds the data of %s, and the node's allocations cannot be read to verify the asker (%v)", s.ID, s.Owner, err)
				continue
			}
			*read = v
			rs.slots.SetIncomplete(v.Incomplete)
		}
		switch d := decide.Decide(ctx, rs.log, rs.arm, nomad, *read, s, true); d.Kind {
		case decide.Adopt:
			adopted, why, err := rs.work.AdoptArmed(ctx, s)
			switch {
			case err != nil:
				wait, renew = fmt.Sprintf("device %s: %v", s.ID, err), true
			case !adopted:
				wait, renew = fmt.Sprintf("device %s (dataset %s) was armed by an earlier run of the plugin and is not known to be fresh (%s); its data is kept until no allocation holds it", s.ID, s.Dataset, why), true
			default:
				fresh = append(fresh, id)
			}
		case decide.HandOver:
			back, err := rs.work.MountForOwner(zfs.Foreground(ctx), s)
			if err != nil {
				return nil, "", fmt.Errorf("device %s (dataset %s) cannot go back to its owner %s: %w", s.ID, s.Dataset, s.Owner, err)
			}
			rs.log.Info("slot reserved", "device", s.ID, "dataset", s.Dataset, "owner", s.Owner.String(), "how", "owner", "took", time.Since(arrived))
			res = append(res, back)
		case decide.StartRelease:
			if c := rs.slots.ClassOf([]string{id}); restore.On(c) {
				if d.Asker.Known() && record.SameIdentity(d.Asker, s.Owner) {
					// The replacement of an ended allocation: it keeps
					// the dataset, data and all.
					got, err := rs.restore.InPlace(ctx, s, d.Asker)
					if err == nil {
						res = append(res, got)
						continue
					}
					wait, renew = fmt.Sprintf("device %s: handing the data of %s to its replacement %s: %v", s.ID, s.Owner, d.Asker, err), !errors.Is(err, view.ErrChanged)
					continue
				}
				// Another identity: the dataset is archived, and the
				// asker gets the fresh slot, with its own archive if any.
				d.Asker = record.Owner{}
			}
			if d.Asker.Known() {
				var err error
				if s, err = rs.work.AdoptWithheld(ctx, *read, s, d); err != nil {
					wait, renew = fmt.Sprintf("device %s: %v", s.ID, err), true
					continue
				}
			}
			if d.Asker.Known() && s.Spare != "" && s.OK {
				// The asker gets the spare; the owner's dataset is
				// archived behind it.
				got, err := rs.work.HandOverSpare(ctx, s, d.Asker)
				if err == nil {
					rs.log.Info("slot reserved", "device", s.ID, "dataset", got.Dataset, "owner", d.Asker.String(), "how", "spare", "took", time.Since(arrived))
					res = append(res, got)
					continue
				}
				wait = fmt.Sprintf("device %s is being released from %s (%s)", s.ID, s.Owner, d.Reason)
				if !errors.Is(err, view.ErrChanged) {
					wait, renew = fmt.Sprintf("%s; handing over its spare: %v", wait, err), true
				}
				continue
			}
			release = append(release, decidedRelease{s, d.Asker})
			wait = fmt.Sprintf("device %s is being released from %s (%s)", s.ID, s.Owner, d.Reason)
		case decide.InUse:
			wait, renew = fmt.Sprintf("device %s is in use by %s (%s), and the asker is not among the device's holders", s.ID, s.Owner, d.Reason), true
		default:
			wait, renew = fmt.Sprintf("device %s: %s", s.ID, d.Reason), true
		}
	}
	// Start the releases here rather than wait for the release loop (or
	// join the loop's run), and wait for them: the asker waits for them.
	var runs []Run
	for _, r := range release {
		runs = append(runs, rs.work.Release(ctx, r.slot, r.asker))
	}
	for _, r := range runs {
		select {
		case <-r.Done():
			if err := r.Err(); err != nil {
				wait, renew = fmt.Sprintf("%s; release: %v", wait, err), true
			}
		case <-ctx.Done():
		}
	}
	if wait != "" {
		return nil, wait, nil
	}
	var notes map[string]string
	if c := rs.slots.ClassOf(fresh); c.Restore == reconcile.RestoreBestEffort || c.Restore == reconcile.RestoreRequired {
		o := rs.restore.Fresh(ctx, nomad, c, fresh, arrived, read)
		if o.Wait != "" {
			renew = o.Renew
			return nil, o.Wait, nil
		}
		res = append(res, o.Restored...)
		fresh, notes = o.Fresh, o.Notes
	}
	reserved, err := rs.fresh(ctx, nomad, fresh, spares, arrived, *read)
	if retry := (Retry{}); errors.As(err, &retry) {
		renew = !errors.Is(err, view.ErrChanged)
		return nil, retry.Error(), nil
	}
	if err != nil {
		return nil, "", err
	}
	for id, why := range notes {
		rs.slots.SetEmptyStart(id, why)
	}
	// In the order of ids: the slots' (see the manager's Reserve).
	byID := map[string]view.Slot{}
	for _, s := range append(res, reserved...) {
		byID[s.ID] = s
	}
	out := make([]view.Slot, 0, len(ids))
	for _, id := range ids {
		out = append(out, byID[id])
	}
	return out, "", nil
}
