// Package tenancy holds what the slot manager knows of its slots'
// tenancies beyond what ZFS shows: the owners identified at Reserve and
// not recorded yet, the allocations armed datasets were handed to before
// their proof, the notes on in-use slots, why a tenant started empty, the
// releases begun, and the fates ZFS refused behind a handover. How it is
// laid over each slot's view is package view's (Known.Derive); when each
// is written, and the zfs work behind it, is the manager's (package slots)
// and, through the manager's lock, packages fate (Ended, RefuseFate,
// FateLanded) and spare (SetOwner, SetUnproven).
package tenancy

import (
	"maps"
	"slices"
	"sync"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// Record is the tenancy bookkeeping: one part of the slot manager, with
// its own lock. mu guards the maps below; it is the last lock taken (no
// other is taken while it is held), and never held while a command runs.
// Callers hold the manager's lock (its mu) whenever they read or change a
// Record, so that what they read of a Record and of the slot view in one
// hold of that lock agree; the Record's own lock only keeps a call that
// forgets it from tearing a map.
type Record struct {
	mu sync.Mutex
	// owners are owners identified at Reserve and not yet recorded, by ID.
	owners map[string]record.Owner
	// unproven are, by ID, the allocations this run's armed datasets were
	// prepared for (a slot prepared at placement, a prepared spare's
	// handover), laid over the slot's view but never recorded on ZFS: an
	// owner is recorded only once the proof made behind the Reserve shows
	// it.
	unproven map[string]record.Owner
	// releases counts, by ID, the releases begun (Ended): what a read made
	// for a Reserve says counts only if none began since the handover, for
	// the slot may serve a new dataset of the same name by then.
	releases map[string]uint64
	// notes explain why an in-use slot is kept, by ID.
	notes map[string]view.Note
	// fateRefused is, by dataset, what ZFS answered the fate written
	// behind a handover while it is due: an entry goes when the fate
	// lands (FateLanded), or when a read of ZFS shows no slot's old
	// dataset of that name waiting for its fate (KeepDue).
	fateRefused map[string]error
	// emptyStarts say, by ID, why the tenant of a slot of a class with
	// restore = "best-effort" started empty; gone when its release starts.
	emptyStarts map[string]string
}

// New returns an empty record.
func New() *Record {
	return &Record{
		owners: map[string]record.Owner{}, unproven: map[string]record.Owner{}, releases: map[string]uint64{},
		notes: map[string]view.Note{}, fateRefused: map[string]error{}, emptyStarts: map[string]string{},
	}
}

// Owner returns the owner of slot id identified at Reserve and not
// recorded yet, if any.
func (r *Record) Owner(id string) (record.Owner, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.owners[id]
	return o, ok
}

// SetOwner sets the owner of slot id to record on ZFS (a zero one: that
// an armed dataset was handed over, its owner unknown).
func (r *Record) SetOwner(id string, o record.Owner) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owners[id] = o
}

// DropOwner forgets the pending owner of slot id when it is o.
func (r *Record) DropOwner(id string, o record.Owner) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owners[id] == o {
		delete(r.owners, id)
	}
}

// Pending reports whether an owner identified at Reserve is not recorded
// yet.
func (r *Record) Pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.owners) > 0
}

// Owners returns a copy of the owners not recorded yet, by ID.
func (r *Record) Owners() map[string]record.Owner {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.owners)
}

// SetUnproven lays asker over slot id's view until its proof answers.
func (r *Record) SetUnproven(id string, asker record.Owner) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unproven[id] = asker
}

// Unproven reports whether slot id waits for the proof of its asker.
func (r *Record) Unproven(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.unproven[id]
	return ok
}

// Proven forgets the unproven asker of slot id: its proof answered.
func (r *Record) Proven(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.unproven, id)
}

// Noted reports whether an in-use slot id has a note.
func (r *Record) Noted(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.notes[id]
	return ok
}

// SetNote sets (or, with a zero note, clears) the note of slot id, and
// reports whether it changed; the caller publishes it.
func (r *Record) SetNote(id string, n view.Note) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.notes[id] == n {
		return false
	}
	if n == (view.Note{}) {
		delete(r.notes, id)
	} else {
		r.notes[id] = n
	}
	return true
}

// SetEmptyStart records why the tenant of slot id started empty.
func (r *Record) SetEmptyStart(id, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emptyStarts[id] = why
}

// Releases returns how many releases of slot id have begun (Ended).
func (r *Record) Releases(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.releases[id]
}

// AllReleases returns a copy of the releases begun, by ID.
func (r *Record) AllReleases() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.releases)
}

// Ended drops what is known of slot id's tenancy (its pending owner,
// unproven asker, note, empty start) once its release has begun, and
// counts the release.
func (r *Record) Ended(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.owners, id)
	delete(r.unproven, id)
	delete(r.notes, id)
	delete(r.emptyStarts, id)
	r.releases[id]++
}

// Restored drops slot id's pending owner, note and empty start when an
// ended allocation's dataset goes to its replacement in place: no
// release begins.
func (r *Record) Restored(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.owners, id)
	delete(r.notes, id)
	delete(r.emptyStarts, id)
}

// FateRefused returns what ZFS answered the fate of dataset ds written
// behind a handover, while it is due and was refused; nil otherwise.
func (r *Record) FateRefused(ds string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fateRefused[ds]
}

// RefuseFate records that ZFS refused the fate of dataset ds with err.
func (r *Record) RefuseFate(ds string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fateRefused[ds] = err
}

// FateLanded forgets a refusal of dataset ds's fate: it landed, or the
// dataset is gone.
func (r *Record) FateLanded(ds string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.fateRefused, ds)
}

// KeepDue drops the refusals of fates that the slot views read from ZFS
// (slots, about to be published) show no longer due: landed, or left by
// other means (the dataset destroyed by hand, say). A view not read from
// ZFS (the slots reset by a new configuration until the next read) says
// nothing of them.
func (r *Record) KeepDue(slots []view.Slot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ds := range r.fateRefused {
		if !slices.ContainsFunc(slots, func(s view.Slot) bool { return s.FateDue() && s.Old.Dataset == ds }) {
			delete(r.fateRefused, ds)
		}
	}
}

// Derive lays what is known over each of slots (view.Known.Derive), with
// incomplete the reason allocation views may miss allocations ("" for
// none).
func (r *Record) Derive(slots []view.Slot, incomplete string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := view.Known{Owners: r.owners, Unproven: r.unproven, Notes: r.notes, EmptyStarts: r.emptyStarts, FateRefused: r.fateRefused, Incomplete: incomplete}
	for i := range slots {
		k.Derive(&slots[i])
	}
}
