package slots

// Preparation: the zfs work of a Reserve, done when Nomad places an
// allocation on a slot, before that allocation's task asks.
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
// the spare of a slot whose tenant has ended (handed over as handOverSpare
// does: in memory for an armed spare, the old dataset's fate behind it). Nothing is handed over: the
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
// answer, the owner recorded only then (proof.go).
//
// A plugin stopped at any point leaves what one stopped during or right
// after a Reserve leaves: a free dataset, an armed one with no owner, or a
// reserved one, with its owner once recorded (the owner's Reserve then
// gets it through the usual path), unknown before (kept until no
// allocation holds it). A preparation whose
// allocation ends,
// stops or leaves the device before it asks is forgotten (void): the slot
// is then one in use by an ended allocation, released as any other.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/mounts"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// prepTimeout bounds one preparation: the wait for the slot's lock and
// the zfs commands (each with the runner's own timeout).
const prepTimeout = time.Minute

// Prepare is Run's preparation step, for tests and benchmarks: from the
// latest read of the node's allocations, it prepares the slots that read
// shows placed (see the top of this file). On return the preparations it
// started are over; an error says why the read could not be used.
func (m *Manager) Prepare(ctx context.Context) error {
	started, err := m.prepare(ctx)
	for _, p := range started {
		select {
		case <-p.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

// prepare starts, each in a goroutine of its own, the preparation of every
// slot that the latest read of the node's allocations shows placed and not
// prepared yet, and forgets the preparations that read shows void. It
// returns the preparations it started, without waiting for them. It reads
// nothing from the API itself but, for the spare of a slot whose owner is
// not in the list, whether that owner is gone (decide).
func (m *Manager) prepare(ctx context.Context) ([]*preps.Prep, error) {
	m.mu.Lock()
	nomad := m.nomad
	m.mu.Unlock()
	if nomad == nil {
		return nil, nil
	}
	v, err := nomad.Latest(ctx)
	if err != nil {
		return nil, fmt.Errorf("preparing slots: %w", err)
	}
	m.voidPreps(v)
	if !v.Complete {
		// The sole visible holder is no proof of the sole holder.
		return nil, nil
	}
	var started []*preps.Prep
	for _, s := range m.Slots() {
		if s.Unreadable || s.Surplus || !s.OK || restores(m.classOf([]string{s.ID})) {
			continue
		}
		holders := v.Holders(s.ID)
		switch {
		case s.State == record.StateFree && s.Mountpoint != "":
			if len(holders) != 1 || !preparable(v, holders[0]) {
				continue
			}
			if p := m.startPrep(ctx, s, holders[0].Owner, preps.Fresh, v.Began); p != nil {
				started = append(started, p)
			}
		case s.State == record.StateReserved && s.Owner.Known() && s.Spare != "" && s.Old == nil:
			var others []Holding
			for _, h := range holders {
				if h.Owner.AllocID != s.Owner.AllocID {
					others = append(others, h)
				}
			}
			if len(others) != 1 || !preparable(v, others[0]) || m.prepOf(s.ID) != nil {
				continue
			}
			if _, listed := v.Allocs[s.Owner.AllocID]; !listed {
				// Whether it is gone is a call to the API: the asker's
				// Reserve asks it.
				continue
			}
			// The decision the asker's own Reserve would make: the owner
			// has ended, and the one other live holder is the asker.
			d := decide.Decide(ctx, m.log, m.arm, nomad, v, s, true)
			if d.Kind != decide.StartRelease || d.Asker.AllocID != others[0].Owner.AllocID {
				continue
			}
			if p := m.startPrep(ctx, s, d.Asker, preps.Spare, v.Began); p != nil {
				started = append(started, p)
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
func preparable(v *View, h Holding) bool {
	a, ok := v.Allocs[h.Owner.AllocID]
	return ok && !h.Started && !a.Stopping && (a.ClientStatus == "pending" || a.ClientStatus == "running")
}

// prepOf returns the preparation of slot id, or nil.
func (m *Manager) prepOf(id string) *preps.Prep { return m.preps.Of(id) }

// startPrep registers a preparation of slot s (as last seen) for asker and
// starts it, unless the slot has one already or a Reserve for it is under
// way; it returns the preparation, or nil when it started none.
func (m *Manager) startPrep(ctx context.Context, s Slot, asker record.Owner, how string, began time.Time) *preps.Prep {
	p := preps.New(asker, how, began)
	if !m.preps.Start(s.ID, p) {
		return nil
	}
	go func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), prepTimeout)
		defer cancel()
		// The asker's task is starting: from before the preparation
		// starts a background run (the release behind a handover), and
		// again once it is prepared.
		m.starts.Begin()
		start := time.Now()
		var (
			dataset string
			armed   bool
			err     error
		)
		if how == preps.Fresh {
			dataset, armed, err = m.prepareFresh(pctx, s, asker)
		} else {
			var got Slot
			if got, err = m.handOverSpareTo(pctx, s, asker, true); err == nil {
				dataset, armed = got.Dataset, got.Armed != ""
			}
		}
		if err == nil && !armed {
			defer func() {
				// Right behind the mark of a dataset that is not armed
				// (after done: off the Reserve's path), so that a plugin
				// restarted before the task asks finds its owner; else
				// the next pass records it. An armed one's owner is
				// recorded only once proven (proof.go): a restart
				// before finds an armed dataset with no owner.
				if rerr := m.recordOwner(pctx, s.ID, asker); rerr != nil {
					m.log.Debug("owner of a prepared slot not recorded yet; the next pass does", "device", s.ID, "error", rerr)
				}
			}()
		}
		if err != nil {
			m.preps.Drop(s.ID, p)
			if !errors.Is(err, errChanged) {
				m.log.Warn("preparing a slot for its allocation failed; its Reserve does the work", "device", s.ID, "asker", asker.String(), "how", how, "error", err)
			}
		} else {
			m.starts.Begin()
			m.log.Debug("slot prepared", "device", s.ID, "dataset", dataset, "asker", asker.String(), "how", how, "took", time.Since(start))
		}
		p.Finish(dataset, armed, err)
	}()
	return p
}

// prepareFresh records free slot s reserved for asker, under the slot's
// lock, after checking that it is still free and mounted as it must be:
// in memory for a dataset armed by this run, else with one zfs command.
// The asker's owner of a dataset not armed is recorded behind it
// (recordOwner), as markReserved and package reserve do for a Reserve; that
// of an armed one only once the proof behind its Reserve shows it
// (proof.go). It returns the dataset and whether it is armed, or
// errChanged when the slot is no longer free.
func (m *Manager) prepareFresh(ctx context.Context, s Slot, asker record.Owner) (ds string, armed bool, err error) {
	unlock, err := m.lockSlot(ctx, s.ID, "prepare")
	if err != nil {
		return "", false, fmt.Errorf("preparing device %s: %w", s.ID, err)
	}
	defer unlock()
	cur, ok := m.slot(s.ID)
	if !ok || cur.State != record.StateFree || !cur.OK || cur.Mountpoint == "" || cur.Dataset != s.Dataset {
		return "", false, errChanged
	}
	m.mu.Lock()
	want := hostfs.FlagsFor(reconcile.ClassByName(m.cfg, cur.Class).SlotProps())
	m.mu.Unlock()
	if err := mounts.CheckMounted(cur.Mountpoint, want); err != nil {
		m.updateSlot(cur.ID, func(x *Slot) { x.SetHealth(false, err.Error()) })
		return "", false, fmt.Errorf("device %s (dataset %s) cannot be prepared: %w", cur.ID, cur.Dataset, err)
	}
	if cur.Armed != "" {
		// Armed by this run: no zfs command (package armed).
		if !m.arm.Claim(cur.Dataset, cur.Armed) {
			return "", false, errChanged // made again since this view
		}
	} else if err := m.zfs.Set(zfs.Foreground(ctx), cur.Dataset, record.PropState, string(record.To(record.Reserve))); err != nil {
		// Foreground: the asker's Reserve may be waiting for it.
		m.unmarkFresh(ctx, cur)
		return "", false, fmt.Errorf("preparing device %s (dataset %s) for %s: %w", cur.ID, cur.Dataset, asker, err)
	}
	m.mu.Lock()
	if cur.Armed != "" {
		m.unproven[cur.ID] = asker // recorded once proven (proof.go)
	} else {
		m.owners[cur.ID] = asker
	}
	m.mu.Unlock()
	m.setNote(cur.ID, note{})
	m.updateSlot(cur.ID, func(x *Slot) { x.State, x.Owner, x.Stamped = record.StateReserved, asker, record.Owner{} })
	if cur.Armed == "" {
		m.Kick() // record the owner, off the asker's path
	}
	return cur.Dataset, cur.Armed != "", nil
}
