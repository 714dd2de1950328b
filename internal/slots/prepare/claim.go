package prepare

// A Reserve of a prepared slot: the preparations claimed by the Reserve
// of their allocation (the manager's claimPreps, Preparer.Reserve), and voided when the
// view no longer shows their allocation placed and not started.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reserve"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/restore"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// void forgets the finished preparations that view v, begun after
// them, no longer supports: their allocation is not the device's only
// live holder, or no longer one a slot is prepared for (preparable: it
// failed, say, or is told to stop), or the slot no longer serves the
// dataset prepared. Their slot stays recorded in use by that allocation, and is
// released as any other once it has ended. A preparation a Reserve has
// claimed is not in p.preps.
//
// An incomplete view (a namespace the token cannot read) proves nothing
// of an allocation it does not list, but what it shows of one it lists is
// so: a preparation whose allocation it lists is judged as above. Voiding
// never hands anything over: the asker's Reserve takes the usual path,
// which, while the views stay incomplete, hands over nothing (decide keeps
// the slot). A void is so final for its asker, and is right only because
// every reason for it is one for which Reserve would refuse too:
// the slot changed, or its allocation ended, is stopping, is not pending
// or running, or no longer holds the device (Nomad.Holds). Kept past its
// allocation's end, a preparation costs the next Reserve of the device a
// read of that allocation (up to reserve.IdentifyGrace) before the usual path.
func (p *Preparer) void(v *allocs.View) {
	// The finished preparations the view began after, then the slots they
	// prepared as the manager sees them now: each under its own lock.
	cand := p.preps.FinishedBefore(v.Began)
	if len(cand) == 0 {
		return
	}
	var void []string
	for _, id := range slices.Sorted(maps.Keys(cand)) {
		x := cand[id]
		s, ok := p.slots.Slot(id)
		if !ok || s.Dataset != x.Dataset || s.State != record.StateReserved {
			void = append(void, id)
			continue
		}
		if _, listed := v.Allocs[x.Asker.AllocID]; !listed && !v.Complete {
			continue
		}
		hs := v.Holders(id)
		if len(hs) != 1 || hs[0].Owner.AllocID != x.Asker.AllocID || hs[0].Owner.Task != x.Asker.Task || !preparable(v, hs[0]) {
			void = append(void, id)
		}
	}
	var voided []string
	for _, id := range void {
		if p.preps.Drop(id, cand[id]) { // not claimed or replaced meanwhile
			voided = append(voided, id)
		}
	}
	for _, id := range voided {
		p.log.Debug("preparation void: its allocation is no longer the device's only live holder", "device", id)
	}
}

// Reserve hands the slots of ids, each prepared for the one allocation in
// ps, to the asker: no zfs command, one small read made after the Reserve
// arrived, that shows that allocation still live, wanted running and
// holding them (see the package doc). Datasets armed by this run are
// handed over at once and proven behind the answer (the manager's
// answerBeforeProof, slots/proof.go); others once the read has shown it.
// ok is false, with the reason, when it cannot: a preparation failed or
// does not match the slot any more, they are for different allocations,
// or the read does not show it (including a read that fails or takes
// longer than reserve.IdentifyGrace). The caller then takes the usual
// path. It waits for the preparations still under way, at most until ctx
// is done.
func (p *Preparer) Reserve(ctx context.Context, nomad allocs.Nomad, ids []string, ps []*preps.Prep, arrived time.Time) (res []view.Slot, ok bool, why string) {
	for _, x := range ps {
		select {
		case <-x.Done():
		case <-ctx.Done():
			return nil, false, fmt.Sprintf("its preparation did not end in time (%v)", ctx.Err())
		}
		if x.Err != nil {
			return nil, false, fmt.Sprintf("its preparation failed (%v)", x.Err)
		}
	}
	asker := ps[0].Asker
	if restore.On(p.slots.ClassOf(ids)) {
		// Its Reserve decides which dataset the asker gets (restore was
		// turned on since the preparation).
		return nil, false, "the class restores"
	}
	cfg := p.slots.Config()
	for i, id := range ids {
		x := ps[i]
		if x.Asker != asker {
			return nil, false, fmt.Sprintf("prepared for %s and %s", asker, x.Asker)
		}
		cur, found := p.slots.Slot(id)
		if !found || cur.State != record.StateReserved || cur.Dataset != x.Dataset ||
			cur.Owner.AllocID != asker.AllocID || cur.Owner.Task != asker.Task {
			return nil, false, "the slot changed since it was prepared"
		}
		// As every handover does: the kernel's mount table, not what was
		// true at the preparation (unmounted by hand since, say).
		if !cur.OK || cur.Unreadable || cur.Mountpoint == "" {
			return nil, false, fmt.Sprintf("device %s is not sound now: %s", id, view.OrDash(cur.Why))
		}
		if err := mounts.CheckMounted(cur.Mountpoint, hostfs.FlagsFor(reconcile.ClassByName(cfg, cur.Class).SlotProps())); err != nil {
			return nil, false, fmt.Sprintf("device %s: %v", id, err)
		}
		res = append(res, cur)
	}
	if nomad == nil {
		return nil, false, "no Nomad API to verify the asker"
	}
	armed := true
	for _, x := range ps {
		armed = armed && x.Armed
	}
	if armed {
		// Fresh and never handed over: answered now, proven behind.
		res, ok, why = p.work.AnswerBeforeProof(ctx, nomad, ids, ps, res, asker, arrived)
		return res, ok, why
	}
	hctx, cancel := context.WithTimeout(ctx, reserve.IdentifyGrace)
	err := nomad.Holds(hctx, asker, ids)
	cancel()
	if err != nil {
		return nil, false, fmt.Sprintf("the read made for this Reserve does not show %s live and holding it: %v", asker, err)
	}
	for i, s := range res {
		p.work.ClearNote(s.ID)
		p.log.Info("slot reserved", "device", s.ID, "dataset", s.Dataset, "owner", asker.String(), "how", ps[i].How, "prepared", true, "took", time.Since(arrived))
	}
	for _, s := range res {
		p.work.GoTend(ctx, s.ID) // the spare, for the next tenant
	}
	return res, true, ""
}
