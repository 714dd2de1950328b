package slots

// The spare a restart withholds. A run hands an armed spare over in
// memory and writes the fate of the dataset it replaces behind the
// handover (spare.Hander.HandOver), so a run stopped in between leaves on ZFS a
// dataset in use by an ended owner beside an armed dataset with no owner:
// the spare, maybe handed over, maybe written by its new tenant. The next
// run cannot tell that from a spare never handed over, and withholds it
// (pair.roles): neither offered nor made again. adoptWithheld takes it for
// the slot's spare on proof, from a read of the allocations; short of
// proof it stays withheld, and once the dataset beside it is released it
// is judged as any earlier run's armed dataset (decide.MayAdopt).

import (
	"context"
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
)

// adoptWithheld takes the withheld dataset of reserved slot s for the
// slot's spare when decision d, made from view v (asking: for a Reserve),
// proves that nobody has it nor left anything in it. The proof needs a
// complete view begun after this run started, the withheld dataset's
// root, mounted from it, empty, and either
//   - the owner recorded on the slot's dataset live and alone (d.Live): a
//     spare is handed over only once the owner has ended, and "ended"
//     never goes back (the root is checked all the same: the owner may be
//     a replacement that got the dataset in place since, package restore); or
//   - the owner ended, and nobody holding the device but, for a Reserve,
//     the asker, whose task has not started.
//
// It works under the slot's lock, and only while the slot still shows
// what s shows. It returns the slot as it is once the dataset is adopted,
// else s, the dataset still withheld.
func (m *Manager) adoptWithheld(ctx context.Context, v *View, s Slot, d decide.Decision, asking bool) (Slot, error) {
	ok, live := decide.MayAdoptWithheld(m.arm, v, s, d, asking)
	if !ok {
		return s, nil
	}
	lctx, cancel := ctx, context.CancelFunc(func() {})
	if !asking {
		// A release pass does not wait for work on one slot: the next
		// pass tries again.
		lctx, cancel = context.WithTimeout(ctx, ownerLockWait)
	}
	unlock, err := m.lockSlot(lctx, s.ID, "adopt the withheld spare")
	cancel()
	switch {
	case err != nil && !asking && ctx.Err() == nil:
		return s, nil
	case err != nil:
		return s, fmt.Errorf("adopting the withheld spare of %s: %w", s.ID, err)
	}
	defer unlock()
	cur, ok := m.slot(s.ID)
	if !ok || !sameTenancy(cur, s) || cur.Withheld == nil || cur.Withheld.Dataset != s.Withheld.Dataset || cur.Withheld.Armed != s.Withheld.Armed {
		return s, nil
	}
	w := *cur.Withheld
	m.mu.Lock()
	want := hostfs.FlagsFor(reconcile.ClassByName(m.cfg, s.Class).SlotProps())
	m.mu.Unlock()
	if why := mounts.MayBeWritten(ctx, w.Dataset, w.Mountpoint, want); why != "" {
		m.log.Info("an earlier run's spare stays withheld: it may have been handed over", "device", s.ID, "dataset", w.Dataset, "reason", why)
		return s, nil
	}
	m.arm.Adopt(w.Armed)
	var out Slot
	m.updateSlot(s.ID, func(x *Slot) {
		x.Spare, x.SpareMount, x.SpareOwn, x.SpareArmed = w.Dataset, w.Mountpoint, w.OwnMount, w.Armed
		x.Withheld, x.Sib = nil, reconcile.NameFresh
		if x.WhyWithheld {
			x.SetHealth(true, "")
		}
		out = *x
	})
	proof := "its root is empty and nobody holds the device but a task not started"
	if live {
		proof = "its root is empty and the owner beside it is live"
	}
	m.log.Info("an earlier run's spare adopted: nobody has it", "device", s.ID, "spare", w.Dataset, "owner", s.Owner.String(), "proof", proof)
	return out, nil
}
