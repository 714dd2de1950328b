// Package reserve holds the rounds of the slot manager's Reserve: from the
// checks of the IDs to the slots handed over, or the reason to wait. Each
// round reads the slots, decides each one (a fresh slot is marked
// reserved, a reserved one judged by package decide from one allocation
// read begun after the call arrived, an archive restored by package
// restore, a release started and waited for), and the rounds go on until
// every slot is handed over or the call's context is done. It reaches the
// manager through two small interfaces it declares: Slots (what a Reserve
// reads and records of the slot list) and Work (the work on one slot,
// under that slot's lock, that the manager carries out). Reserve itself
// (slots/reserve.go) keeps what the manager counts and tells: the starts
// under way, the preparations claimed, the observer.
package reserve

import (
	"context"
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

// Slots is what a Reserve reads and records of the manager's slots. None
// of it runs a command or waits for one.
type Slots interface {
	// Slot returns the current view of one slot.
	Slot(id string) (view.Slot, bool)
	// CheckIDs verifies that every ID names a slot and that all are of
	// one class; ClassOf returns the class of the first of ids.
	CheckIDs(ids []string) error
	ClassOf(ids []string) reconcile.Class
	// Changed is closed at the next change of the slot list; Kick wakes
	// the release pass.
	Changed() <-chan struct{}
	Kick()
	// Nomad is where the manager learns about allocations (nil for none).
	Nomad() allocs.Nomad
	// SetIncomplete says why the latest allocation read may miss
	// allocations ("" when it sees them all).
	SetIncomplete(why string)
	// NoteAsked records that a Reserve arrived at arrived, before it may
	// hand over a dataset whose asker a release pass has not seen.
	NoteAsked(arrived time.Time)
	// HeldForNext reports whether reserved slot s is held for its next
	// tenant, its spare ready (a release pass found its owner ended).
	HeldForNext(s view.Slot) bool
	// ReleasesOf returns how many releases of slot id have begun.
	ReleasesOf(id string) uint64
	// Identified records what the read made for a Reserve says of slot
	// s, handed over with released releases begun: its owner o, or, when
	// why says it is unknown, a note that keeps the data. It reports
	// whether the slot still served that dataset.
	Identified(s view.Slot, released uint64, o record.Owner, why string) bool
	// SetEmptyStart says why the tenant of slot id started empty (a
	// best-effort restore that could not be done).
	SetEmptyStart(id, why string)
	// AwaitProofs waits for the proofs under way behind a prepared slot's
	// Reserve on the slots of ids, until ctx is done.
	AwaitProofs(ctx context.Context, ids []string) error
}

// Work is the work on slots that a Reserve has the manager carry out, each
// under the slot's lock.
type Work interface {
	// ReservePrepared hands over slots prepared at placement for the one
	// allocation in ps; ok is false, with why, when the usual rounds must
	// decide.
	ReservePrepared(ctx context.Context, nomad allocs.Nomad, ids []string, ps []*preps.Prep, arrived time.Time) (res []view.Slot, ok bool, why string)
	// MarkReserved records a fresh slot as reserved (a Retry error when
	// it is no longer fresh).
	MarkReserved(ctx context.Context, id string) (view.Slot, error)
	// MountForOwner mounts reserved slot s for its owner, who asked again.
	MountForOwner(ctx context.Context, s view.Slot) (view.Slot, error)
	// AdoptArmed adopts the dataset of slot s that an earlier run armed,
	// when it is known to be fresh (adopted), or says why not.
	AdoptArmed(ctx context.Context, s view.Slot) (adopted bool, why string, err error)
	// AdoptWithheld adopts the spare a restart withheld beside slot s,
	// when decision d and view v prove it may be.
	AdoptWithheld(ctx context.Context, v *allocs.View, s view.Slot, d decide.Decision) (view.Slot, error)
	// HandOverSpare gives asker the spare of reserved slot s, whose owner
	// has ended, and releases the owner's dataset behind it.
	HandOverSpare(ctx context.Context, s view.Slot, asker record.Owner) (view.Slot, error)
	// Release starts the release of slot s for asker, which waits for it
	// (so it yields to no other start).
	Release(ctx context.Context, s view.Slot, asker record.Owner) Run
	// GoTend makes slot id's next spare in the background.
	GoTend(ctx context.Context, id string)
}

// Run is a release that a Reserve started and waits for.
type Run interface {
	// Done is closed once the run is over; Err is then how it went.
	Done() <-chan struct{}
	Err() error
}

// Restorer restores archives at Reserve (*restore.Restorer).
type Restorer interface {
	Fresh(ctx context.Context, nomad allocs.Nomad, c reconcile.Class, ids []string, arrived time.Time, read **allocs.View) restore.Outcome
	InPlace(ctx context.Context, s view.Slot, asker record.Owner) (view.Slot, error)
}

// Reserver runs the rounds of Reserve for one manager. It holds no state
// of its own beyond what it is given.
type Reserver struct {
	slots   Slots
	work    Work
	restore Restorer
	arm     decide.Armed
	log     hclog.Logger
}

// New returns a reserver that reads and records the manager's slots
// through s, has w do the work on them, restores through r and judges
// armed datasets with arm.
func New(s Slots, w Work, r Restorer, arm decide.Armed, log hclog.Logger) *Reserver {
	return &Reserver{slots: s, work: w, restore: r, arm: arm, log: log}
}

// IdentifyGrace is how long Reserve on a fresh slot waits, after its one
// zfs command, for the allocation read that tells who asked. A fresh dataset
// is empty, so it is handed over either way; without the read its owner
// stays unknown and the slot is kept until no allocation holds it.
const IdentifyGrace = 2 * time.Second

// Retry is an error of one round of Reserve that the next round may
// not meet (the slot changed, ZFS refused for now): Reserve waits and
// tries again, until its context is done.
type Retry struct{ Err error }

func (r Retry) Error() string { return r.Err.Error() }
func (r Retry) Unwrap() error { return r.Err }
