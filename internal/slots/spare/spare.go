// Package spare hands a slot's spare to the asker of a Reserve whose
// owner has ended: an armed spare in memory, the old dataset's fate
// written behind it (package fate); a spare of an earlier build marked
// reserved beside the fate. The old dataset's release then runs in the
// background (package release's Runs). The slot's lock, its view and the
// work on its datasets are the manager's (package slots), reached through
// Slots.
package spare

import (
	"context"
	"errors"
	"fmt"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/fate"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/tenancy"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Slots is what a handover needs of the manager (package fate's Slots,
// and more).
type Slots interface {
	fate.Slots
	// Lock takes slot id's lock (what says why, for the log of a wait).
	Lock(ctx context.Context, id, what string) (unlock func(), err error)
	// WriteBackFree records dataset, of slot id, free again after a mark
	// of it as reserved, bounded even when ctx has ended.
	WriteBackFree(ctx context.Context, id, dataset string) error
	// ReleaseOld carries out the release of the old dataset of slot now,
	// whose fate has landed, in run r, under the slot's lock (given up
	// through unlock before it returns): its steps up to the rename
	// outside the lock.
	ReleaseOld(ctx context.Context, now view.Slot, r *release.Run, unlock func()) error
	// Observe tells the observer of a release run of a slot of class.
	Observe(class string, err error, began time.Time)
}

// Armed is what a handover asks of this run's armed datasets (package
// armed's Tracker).
type Armed interface {
	Current(name, token string) bool
	HandOver(token, dataset string)
}

// ZFS marks a spare reserved.
type ZFS interface {
	Set(ctx context.Context, name, prop, value string) error
}

// Hander hands spares over. It has no state of its own.
type Hander struct {
	zfs   ZFS
	arm   Armed
	runs  *release.Runs
	fates *fate.Writer
	slots Slots
	log   hclog.Logger
}

// New returns a Hander.
func New(z ZFS, arm Armed, runs *release.Runs, fates *fate.Writer, slots Slots, log hclog.Logger) *Hander {
	return &Hander{zfs: z, arm: arm, runs: runs, fates: fates, slots: slots, log: log}
}

// Promote makes the spare of x serve, in state, and its dataset x's
// old one (being released). x is the slot's view right after its release
// began.
func Promote(x *view.Slot, state record.State) {
	rs := *x
	rs.Spare, rs.SpareMount, rs.SpareArmed, rs.Old = "", "", "", nil
	x.Dataset, x.Mountpoint, x.OwnMount, x.Armed = x.Spare, x.SpareMount, x.SpareOwn, x.SpareArmed
	x.State, x.Owner, x.Stamped = state, record.Owner{}, record.Owner{}
	x.Spare, x.SpareMount, x.SpareOwn, x.SpareArmed = "", "", false, ""
	x.Old, x.Sib, x.Exists = &rs, reconcile.NameReleasing, true
	x.Usage = zfs.Usage{}
	x.SetHealth(true, "")
}

// unmark records the spare of cur as free again after it was marked
// reserved for an asker that does not get it (the old dataset's fate could
// not be written), or after its mark was cut short (whether it landed is
// not known): nobody has had it, so it is still fresh. It reports whether
// the spare is still offered. When ZFS refuses the write-back too, the
// spare is no longer offered, and the next read decides from what ZFS
// says: a spare recorded reserved, for no owner, is kept until no
// allocation holds the device (beside an old dataset also in use, a
// conflict that keeps both). The write-back is bounded even when ctx has
// ended (Slots.WriteBackFree).
func (h *Hander) unmark(ctx context.Context, cur view.Slot) bool {
	err := h.slots.WriteBackFree(ctx, cur.ID, cur.Spare)
	if err == nil {
		return true
	}
	h.slots.Update(cur.ID, func(x *view.Slot) { x.Spare, x.SpareMount, x.SpareArmed = "", "", "" })
	h.log.Error("spare marked reserved for an asker that did not get it, and it cannot be marked free again; it is kept until no allocation holds the device", "device", cur.ID, "spare", cur.Spare, "error", err)
	return false
}

// HandOver gives the asker of a Reserve the spare of reserved slot s,
// whose owner has ended (decide said so, from a read that began after the
// Reserve arrived, and the asker is the one other holder of the device;
// or a release pass did, and the asker, unknown here, is identified by
// the caller as for a fresh slot: see package reserve):
// a spare armed by this run (package armed) is handed over in memory and the
// fate of the owner's dataset written behind it, first in that dataset's
// release run (fate.Writer.Behind); a `free` spare of an earlier build is
// marked reserved beside the fate, two zfs commands side by side, before
// it is handed over. It returns the slot as the asker gets it; the asker
// is recorded as owner off its path, as for a fresh slot (behind a fate,
// once the fate has landed). The owner's dataset is then archived (or
// destroyed) in the background, in a run registered before the slot's
// lock is given up, and its name made again as the slot's next spare. It
// returns view.ErrChanged when the slot is no longer what s says, and an error
// when ZFS refuses a fate or mark written before the handover; the
// owner's data is kept either way, and the spare stays fresh
// (unmark). prepared: the asker is the allocation placed on the slot, not
// proven yet (a preparation, package prepare), so an armed spare's owner
// is only laid over the view (the tenancy's unproven askers), and not
// recorded until the proof behind its Reserve shows it (the manager's
// proof.go).
func (h *Hander) HandOver(ctx context.Context, s view.Slot, asker record.Owner, prepared bool) (view.Slot, error) {
	unlock, err := h.slots.Lock(ctx, s.ID, "hand over the spare")
	if err != nil {
		return view.Slot{}, fmt.Errorf("handing over the spare of %s: %w", s.ID, err)
	}
	cur, ok := h.slots.Slot(s.ID)
	if !ok || !view.SameTenancy(cur, s) || cur.Spare != s.Spare || cur.Old != nil || cur.SpareArmed != "" && !h.arm.Current(cur.Spare, cur.SpareArmed) {
		unlock()
		return view.Slot{}, view.ErrChanged
	}
	c := h.slots.Class(cur.Class)
	if err := mounts.CheckMounted(cur.SpareMount, hostfs.FlagsFor(c.SlotProps())); err != nil {
		h.slots.Update(s.ID, func(x *view.Slot) { x.Spare, x.SpareMount, x.SpareArmed = "", "", "" })
		unlock()
		h.log.Warn("spare not mounted as it must be; the slot is released the slow way", "device", s.ID, "spare", cur.Spare, "error", err)
		return view.Slot{}, view.ErrChanged
	}
	var state record.State
	var herr error // the spare's mark
	// r is the old dataset's release run, registered under the slot's lock
	// before it is given up; behind: its first step is the old dataset's
	// fate (fate.Writer.Behind).
	var r *release.Run
	created, behind := false, false
	if cur.SpareArmed != "" && cur.Stamped.Known() && cur.Stamped == cur.Owner {
		// Armed by this run (package armed), beside a dataset whose owner is
		// recorded: the spare is handed over in memory, and the old
		// dataset's fate is written behind the handover, first thing in
		// the release run registered here, before the slot's lock is
		// given up. Until it lands ZFS shows the old dataset in use by
		// its owner beside a handover not recorded yet: to this run the
		// handover serves and the fate is due (pair.roles); a later run
		// withholds the spare (adoptWithheld). The asker's owner is
		// recorded once the fate has landed (the manager's recordOwner). When a run is
		// registered already (it waits for the lock), the fate is
		// written first, as below.
		if r, created = h.runs.New(s.ID, true); created {
			behind, state = true, record.StateReserved
			h.slots.Tenancy(func(t *tenancy.Record) bool { t.Ended(cur.ID); return false })
		}
	}
	if behind {
		h.arm.HandOver(cur.SpareArmed, cur.Spare)
	} else if cur.SpareArmed != "" {
		// Armed by this run: only the old dataset's fate goes to ZFS, and
		// the spare is handed over in memory once it landed.
		if state, err = h.fates.Write(zfs.Foreground(ctx), c, cur, cur.Owner, cur.Spare); err != nil {
			unlock()
			return view.Slot{}, err
		}
		h.arm.HandOver(cur.SpareArmed, cur.Spare)
	} else {
		// The spare's mark and the old dataset's fate go to ZFS side by side,
		// so that the asker waits for one transaction group rather than two.
		// Either order is safe: a plugin stopped between them leaves the old
		// dataset archived beside a free spare, or both datasets recorded in
		// use, a conflict that keeps both until one is released (reconcile.Pair).
		fg := zfs.Foreground(ctx)
		marked := make(chan error, 1)
		go func() { marked <- h.zfs.Set(fg, cur.Spare, record.PropState, string(record.To(record.Reserve))) }()
		state, err = h.fates.Write(fg, c, cur, cur.Owner, cur.Spare)
		herr = <-marked
		// The spare is recorded free again when its mark took effect but the
		// fate did not, and whenever the mark was cut short by the context: it
		// may have reached ZFS before its process was stopped, so whether the
		// spare is marked is not known.
		cutShort := errors.Is(herr, context.DeadlineExceeded) || errors.Is(herr, context.Canceled)
		kept := true
		if cutShort || (err != nil && herr == nil) {
			kept = h.unmark(ctx, cur)
		}
		if err != nil {
			unlock()
			return view.Slot{}, err
		}
		if !kept {
			// The fate landed, and the spare, whose mark was cut short,
			// could not be recorded free again: there is no dataset to
			// offer in the old one's place. The next read decides from ZFS
			// (the old dataset's release goes on; the spare, if marked, is
			// kept until no allocation holds the device).
			why := fmt.Sprintf("the spare %s, whose reserved mark was cut short (%v), could not be recorded free again", cur.Spare, herr)
			h.slots.Update(s.ID, func(x *view.Slot) { x.SetHealth(false, why) })
			unlock()
			h.slots.Kick()
			return view.Slot{}, fmt.Errorf("handing over the spare of %s: %s", s.ID, why)
		}
	}
	given := record.StateReserved
	if herr != nil {
		given = record.StateFree // the spare serves as a fresh slot: the next round takes it so
	}
	var out view.Slot
	h.slots.Update(s.ID, func(x *view.Slot) {
		x.State, x.Owner, x.Stamped = state, cur.Owner, cur.Owner
		Promote(x, given) // behind: x.old is reserved, its fate due
		if given == record.StateReserved {
			x.Owner = asker
		}
		out = *x
	})
	switch {
	case given == record.StateReserved && prepared && cur.SpareArmed != "":
		// Prepared: its owner is recorded once proven (the manager's proof.go).
		h.slots.Tenancy(func(t *tenancy.Record) bool { t.SetUnproven(s.ID, asker); return false })
	case given == record.StateReserved && (asker.Known() || cur.SpareArmed != ""):
		// The owner to record, or that an armed spare was handed over
		// (the manager's recordOwner).
		h.slots.Tenancy(func(t *tenancy.Record) bool { t.SetOwner(s.ID, asker); return false })
	}
	// The old dataset's release, under the lock held since its fate was
	// written (or from before it is, behind), so that its first steps
	// follow from what was written.
	if r == nil {
		r, created = h.runs.New(s.ID, true)
	}
	if !created {
		unlock() // a run waits for the lock: it, or the next pass, finishes the release
	} else {
		h.runs.Carry(ctx, s.ID, r, "release", func(ctx context.Context) error {
			began := time.Now()
			now, err := h.fates.BehindLocked(ctx, out, unlock) // behind: first
			if err != nil {
				h.slots.Observe(out.Class, err, began)
				return err
			}
			// Outside the slot's lock up to the rename, so that the
			// asker's owner is recorded meanwhile (the manager's recordOwner).
			if rs := now.Old; rs != nil && !now.FateDue() {
				err = h.slots.ReleaseOld(ctx, now, r, unlock)
			} else {
				unlock()
				h.slots.Kick() // the old dataset is gone: a read settles the slot
			}
			h.slots.Observe(out.Class, err, began)
			return err
		})
	}
	h.slots.Kick() // record the asker as owner, off Reserve's path
	if herr != nil {
		return view.Slot{}, fmt.Errorf("reserving the spare %s of %s: %w", cur.Spare, s.ID, herr)
	}
	return out, nil
}
