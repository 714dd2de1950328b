// Package prepare does the zfs work of a Reserve when Nomad places an
// allocation on a slot, before that allocation's task asks, and hands the
// slots so prepared to that task's Reserve (Preparer.Reserve).
//
// Nomad's scheduler picks the device when it places the allocation; the
// task's Reserve comes later, after the client has pulled the allocation
// and run the task's other prestart hooks (100–300 ms under a churn of
// short jobs, longer when a task downloads artifacts first). The release
// pass sees the placement in the node's allocation list as soon as the
// client does. For a slot that list shows placed, with one live holder that
// has not started, the pass records the slot's dataset reserved (the one
// zfs command a Reserve would run) with that allocation as its owner,
// recorded on ZFS behind it as after a Reserve: the free dataset itself, or
// the spare of a slot whose tenant has ended (handed over as the manager's
// spare.Hander.HandOver does: in memory for an armed spare, the old dataset's fate behind it). Nothing is handed over: the
// dataset is as empty as it was, and the manager remembers that it never
// left (package preps).
//
// When the task's Reserve arrives, the handover needs no zfs command, and
// no read of the node's whole list: one small read of the prepared
// allocation (Nomad.Holds) made after the Reserve arrived proves the asker
// is it. The proof: the complete view the slot was prepared from showed
// that allocation as the device's only live holder (an allocation that
// holds the device and has not ended is live; a task that asks is live:
// its alloc is not ended while its hook waits). Nomad places another
// allocation on the device only once every holder is terminal to the
// scheduler (its client status terminal, or its desired status stop or
// evict), and neither status ever goes back. So when the read shows the
// prepared allocation still live and wanted running, no allocation can
// have been placed on the device since the view, and every allocation
// placed before it, live when it asked, was in it: the asker is the
// prepared allocation. Anything else — the read failing, the allocation
// stopping, another allocation asking — and the Reserve takes the usual
// path for a slot recorded in use by that allocation: a read of the
// node's allocations that began after it arrived decides, and the data
// (none here) is kept until it does.
//
// For a dataset armed by this run the Reserve does not wait for that
// read: it answers at once, and the read proves the asker behind the
// answer, the owner recorded only then (slots/proof.go).
//
// A plugin stopped at any point leaves what one stopped during or right
// after a Reserve leaves: a free dataset, an armed one with no owner, or a
// reserved one, with its owner once recorded (the owner's Reserve then
// gets it through the usual path), unknown before (kept until no
// allocation holds it). A preparation whose
// allocation ends,
// stops or leaves the device before it asks is forgotten (void): the slot
// is then one in use by an ended allocation, released as any other.
//
// The record of the preparations and its lock are package preps'; the work
// on one slot under its lock (a free dataset marked, a spare handed over,
// an owner recorded, a prepared slot answered before its proof) is the
// manager's, reached through Work; what it reads of the slots, through
// Slots.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/restore"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// Slots is what a preparation reads of the manager's slots.
type Slots interface {
	// Nomad is where the manager learns about allocations (nil for none).
	Nomad() allocs.Nomad
	// All returns every slot's current view; Slot, one slot's.
	All() []view.Slot
	Slot(id string) (view.Slot, bool)
	// Config is the configuration the manager works to; ClassOf, the
	// class of the first of ids.
	Config() reconcile.Config
	ClassOf(ids []string) reconcile.Class
}

// Work is the work on one slot, under its lock, that a preparation and the
// Reserve of a prepared slot have the manager do.
type Work interface {
	// Fresh records free slot s reserved for asker: the dataset, and
	// whether it is armed, or view.ErrChanged when it is no longer free.
	Fresh(ctx context.Context, s view.Slot, asker record.Owner) (dataset string, armed bool, err error)
	// Spare hands asker, placed and not proven yet, the spare of reserved
	// slot s, whose owner has ended.
	Spare(ctx context.Context, s view.Slot, asker record.Owner) (view.Slot, error)
	// RecordOwner records asker as the owner of slot id on ZFS.
	RecordOwner(ctx context.Context, id string, asker record.Owner) error
	// AnswerBeforeProof hands over prepared slots res, armed by this run,
	// at once, and proves asker behind the answer; ok is false, with why,
	// when a slot changed.
	AnswerBeforeProof(ctx context.Context, nomad allocs.Nomad, ids []string, ps []*preps.Prep, res []view.Slot, asker record.Owner, arrived time.Time) (out []view.Slot, ok bool, why string)
	// ClearNote forgets why slot id was kept (it is handed over).
	ClearNote(id string)
	// GoTend makes slot id's next spare in the background.
	GoTend(ctx context.Context, id string)
}

// Starts is told when a task's start is under way (*starts.Yield).
type Starts interface{ Begin() }

// Preparer prepares slots at placement for one manager, and hands them to
// their Reserve. Its record is the manager's preps.Record.
type Preparer struct {
	slots  Slots
	work   Work
	preps  *preps.Record
	starts Starts
	arm    decide.Armed
	log    hclog.Logger
}

// New returns a preparer that reads the manager's slots through s, has w
// do the work on them, records its preparations in rec, tells st of the
// starts under way and judges armed datasets with arm.
func New(s Slots, w Work, rec *preps.Record, st Starts, arm decide.Armed, log hclog.Logger) *Preparer {
	return &Preparer{slots: s, work: w, preps: rec, starts: st, arm: arm, log: log}
}

// prepTimeout bounds one preparation: the wait for the slot's lock and
// the zfs commands (each with the runner's own timeout).
const prepTimeout = time.Minute

// Prepare starts, each in a goroutine of its own, the preparation of every
// slot that the latest read of the node's allocations shows placed and not
// prepared yet, and forgets the preparations that read shows void. It
// returns the preparations it started, without waiting for them. It reads
// nothing from the API itself but, for the spare of a slot whose owner is
// not in the list, whether that owner is gone (decide).
func (p *Preparer) Prepare(ctx context.Context) ([]*preps.Prep, error) {
	nomad := p.slots.Nomad()
	if nomad == nil {
		return nil, nil
	}
	v, err := nomad.Latest(ctx)
	if err != nil {
		return nil, fmt.Errorf("preparing slots: %w", err)
	}
	p.void(v)
	if !v.Complete {
		// The sole visible holder is no proof of the sole holder.
		return nil, nil
	}
	var started []*preps.Prep
	for _, s := range p.slots.All() {
		if s.Unreadable || s.Surplus || !s.OK || restore.On(p.slots.ClassOf([]string{s.ID})) {
			continue
		}
		holders := v.Holders(s.ID)
		switch {
		case s.State == record.StateFree && s.Mountpoint != "":
			if len(holders) != 1 || !preparable(v, holders[0]) {
				continue
			}
			if x := p.start(ctx, s, holders[0].Owner, preps.Fresh, v.Began); x != nil {
				started = append(started, x)
			}
		case s.State == record.StateReserved && s.Owner.Known() && s.Spare != "" && s.Old == nil:
			var others []allocs.Holding
			for _, h := range holders {
				if h.Owner.AllocID != s.Owner.AllocID {
					others = append(others, h)
				}
			}
			if len(others) != 1 || !preparable(v, others[0]) || p.preps.Of(s.ID) != nil {
				continue
			}
			if _, listed := v.Allocs[s.Owner.AllocID]; !listed {
				// Whether it is gone is a call to the API: the asker's
				// Reserve asks it.
				continue
			}
			// The decision the asker's own Reserve would make: the owner
			// has ended, and the one other live holder is the asker.
			d := decide.Decide(ctx, p.log, p.arm, nomad, v, s, true)
			if d.Kind != decide.StartRelease || d.Asker.AllocID != others[0].Owner.AllocID {
				continue
			}
			if x := p.start(ctx, s, d.Asker, preps.Spare, v.Began); x != nil {
				started = append(started, x)
			}
		}
	}
	return started, nil
}

// preparable reports whether holding h, of view v, is one a slot is
// prepared for: its task has not started, and its allocation is what the
// Reserve's proof (Nomad.Holds) will ask it to be, pending or running and
// wanted running. An allocation that failed (one task failed: its
// poststop tasks still run) or is told to stop has its device free to the
// scheduler already, so no read can prove it the asker.
func preparable(v *allocs.View, h allocs.Holding) bool {
	a, ok := v.Allocs[h.Owner.AllocID]
	return ok && !h.Started && !a.Stopping && (a.ClientStatus == "pending" || a.ClientStatus == "running")
}

// start registers a preparation of slot s (as last seen) for asker and
// starts it, unless the slot has one already or a Reserve for it is under
// way; it returns the preparation, or nil when it started none.
func (p *Preparer) start(ctx context.Context, s view.Slot, asker record.Owner, how string, began time.Time) *preps.Prep {
	x := preps.New(asker, how, began)
	if !p.preps.Start(s.ID, x) {
		return nil
	}
	go func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), prepTimeout)
		defer cancel()
		// The asker's task is starting: from before the preparation
		// starts a background run (the release behind a handover), and
		// again once it is prepared.
		p.starts.Begin()
		start := time.Now()
		var (
			dataset string
			armed   bool
			err     error
		)
		if how == preps.Fresh {
			dataset, armed, err = p.work.Fresh(pctx, s, asker)
		} else {
			var got view.Slot
			if got, err = p.work.Spare(pctx, s, asker); err == nil {
				dataset, armed = got.Dataset, got.Armed != ""
			}
		}
		if err == nil && !armed {
			defer func() {
				// Right behind the mark of a dataset that is not armed
				// (after done: off the Reserve's path), so that a plugin
				// restarted before the task asks finds its owner; else
				// the next pass records it. An armed one's owner is
				// recorded only once proven (slots/proof.go): a restart
				// before finds an armed dataset with no owner.
				if rerr := p.work.RecordOwner(pctx, s.ID, asker); rerr != nil {
					p.log.Debug("owner of a prepared slot not recorded yet; the next pass does", "device", s.ID, "error", rerr)
				}
			}()
		}
		if err != nil {
			p.preps.Drop(s.ID, x)
			if !errors.Is(err, view.ErrChanged) {
				p.log.Warn("preparing a slot for its allocation failed; its Reserve does the work", "device", s.ID, "asker", asker.String(), "how", how, "error", err)
			}
		} else {
			p.starts.Begin()
			p.log.Debug("slot prepared", "device", s.ID, "dataset", dataset, "asker", asker.String(), "how", how, "took", time.Since(start))
		}
		x.Finish(dataset, armed, err)
	}()
	return x
}
