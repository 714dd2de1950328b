// Package fate writes a dataset's fate: what its release records on ZFS
// first (archived, or destroying), before anything else is done with it.
// It is written before the slot is handed to another tenant (Write), but
// for an armed spare's handover, which is made in memory and has the fate
// written behind it (Behind: see spare.Hander.HandOver and
// reconcile.Pair's roles). The slot's lock is the manager's, held by the
// caller; what the manager knows beyond ZFS is package tenancy's, changed
// through the manager (Slots.Tenancy) so that its view and the slot list
// agree.
package fate

import (
	"context"
	"errors"
	"fmt"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/tenancy"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Props writes a dataset's properties, its state last (package apply's
// Applier).
type Props interface {
	SetProps(ctx context.Context, name string, props map[string]string) error
}

// Slots is what writing a fate needs of the manager's slots.
type Slots interface {
	// Class returns the configured class of that name.
	Class(name string) reconcile.Class
	// Tenancy runs fn on what the manager knows beyond ZFS, with the
	// manager's lock held, and publishes the slot list again when fn
	// says so. fn may call only t's methods: a call back into Slots
	// under that lock would deadlock.
	Tenancy(fn func(t *tenancy.Record) (publish bool))
	// Slot returns the current view of slot id.
	Slot(id string) (view.Slot, bool)
	// Update changes one slot of the view and publishes the change.
	Update(id string, fn func(*view.Slot))
	// Kick wakes the manager's release and owner rounds.
	Kick()
	// Started tells the observer that the release of a dataset of a slot
	// of class has begun.
	Started(class string)
}

// Writer writes fates through the manager. It has no state of its own.
type Writer struct {
	props Props
	slots Slots
	log   hclog.Logger
}

// New returns a Writer.
func New(props Props, slots Slots, log hclog.Logger) *Writer {
	return &Writer{props: props, slots: slots, log: log}
}

// Write records, under the slot's lock (held by the caller), that the
// release of the dataset of cur (of class c, owned by o) has begun: the
// owner when it is not recorded yet, then the dataset's fate (archived,
// or destroying when the class says so), the state last. The slot's
// pending owner and note go (tenancy.Record.Ended). It returns the slot's
// state from now on. When ZFS refuses (a full pool), the data is kept and
// the slot is unhealthy with why. spare names the dataset that serves
// meanwhile, for the log ("" when none).
func (w *Writer) Write(ctx context.Context, c reconcile.Class, cur view.Slot, o record.Owner, spare string) (record.State, error) {
	if err := w.record(ctx, c, cur, o, spare); err != nil {
		// A write cut short by the caller's deadline (a Reserve's
		// reserve_timeout) says nothing about ZFS: a reason found before
		// it, such as a full pool, stays the slot's health.
		noted := false
		w.slots.Tenancy(func(t *tenancy.Record) bool { noted = t.Noted(cur.ID); return false })
		if ctx.Err() == nil || !noted {
			w.slots.Tenancy(func(t *tenancy.Record) bool {
				return t.SetNote(cur.ID, view.Note{Unhealthy: true, Text: view.BlockedText(err)})
			})
		}
		return "", fmt.Errorf("starting the release of %s: %w", cur.ID, err)
	}
	w.slots.Tenancy(func(t *tenancy.Record) bool { t.Ended(cur.ID); return false })
	return release.FateState(c), nil
}

// record writes the fate of x's dataset (of class c, owned by o: its
// owner too when x does not record it), in one zfs command, and logs the
// release's start: what Write and Behind write on ZFS.
func (w *Writer) record(ctx context.Context, c reconcile.Class, x view.Slot, o record.Owner, spare string) error {
	props := map[string]string{record.PropState: string(record.To(release.FateEvent(c)))}
	if o.Known() && !x.Stamped.Known() {
		props[record.PropOwner] = o.Encode()
	}
	if err := w.props.SetProps(ctx, x.Dataset, props); err != nil {
		return err
	}
	w.log.Info("release started", "device", x.ID, "dataset", x.Dataset, "owner", o.String(), "on_release", c.OnRelease, "spare", spare)
	w.slots.Started(x.Class)
	return nil
}

// Behind records the fate of the old dataset of slot view cur, which is
// due (view.Slot.FateDue), under the slot's lock (held by the caller), and
// returns the slot as it is then: no longer due. When ZFS refuses (a full
// pool) the old dataset stays in use on ZFS, data and all, the slot's
// health says why (the tenancy's refused fates: it is not the tenancy's
// note, which the new tenant's own work sets and clears), and the next
// work on the slot writes it again (BehindLocked, first in the manager's
// tendSlotLocked). Once it lands the new tenant's owner can be recorded
// (the manager's recordOwner).
func (w *Writer) Behind(ctx context.Context, cur view.Slot) (view.Slot, error) {
	old := *cur.Old
	c := w.slots.Class(old.Class)
	if err := w.record(ctx, c, old, old.Owner, cur.Dataset); err != nil {
		w.slots.Tenancy(func(t *tenancy.Record) bool {
			if errors.Is(err, zfs.ErrNotExist) {
				t.FateLanded(old.Dataset) // gone: a read of the slot says so
			} else if ctx.Err() == nil {
				t.RefuseFate(old.Dataset, err)
			}
			return true
		})
		return view.Slot{}, fmt.Errorf("slot %s: the fate of its previous dataset %s: %w", cur.ID, old.Dataset, err)
	}
	w.slots.Tenancy(func(t *tenancy.Record) bool { t.FateLanded(old.Dataset); return false })
	w.slots.Update(cur.ID, func(x *view.Slot) {
		if x.FateDue() && x.Old.Dataset == old.Dataset {
			o := *x.Old // shared with earlier copies of the view
			o.State = release.FateState(c)
			x.Old, x.Sib = &o, reconcile.NameReleasing
		}
	})
	w.slots.Kick() // the new tenant's owner, pending until now (recordOwner)
	now, _ := w.slots.Slot(cur.ID)
	return now, nil
}

// BehindLocked writes the fate of cur's old dataset when it is due
// (Behind), first in any tending of the slot (the manager's
// tendSlotLocked), under the slot's lock (held by the caller). A release
// of the slot's own dataset started meanwhile (its new tenant ended)
// writes that dataset's fate before, with its owner (the manager's
// startReleaseLocked): a later run then finds one dataset in use, the old
// one, and one on its way out. It returns the slot as it is then; it
// gives up the lock and returns an error when the fate is refused, but
// for a dataset gone (destroyed by hand): a read of the slot then shows
// so.
func (w *Writer) BehindLocked(ctx context.Context, cur view.Slot, unlock func()) (view.Slot, error) {
	if !cur.FateDue() {
		return cur, nil
	}
	now, err := w.Behind(ctx, cur)
	switch {
	case errors.Is(err, zfs.ErrNotExist):
		return cur, nil
	case err != nil:
		unlock()
		return view.Slot{}, fmt.Errorf("%w; its data is kept", err)
	}
	return now, nil
}
