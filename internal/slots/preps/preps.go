// Package preps holds the slot manager's record of its preparations: the
// slots prepared, or being prepared, at placement for the allocation Nomad
// placed on them, and the Reserves under way, during which no preparation
// starts. What a preparation does (its zfs work) and when one is made,
// claimed or voided is package slots/prepare's (the zfs work done by the
// manager for it); this package keeps only the record and its lock.
package preps

import (
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// Ways a slot is prepared, as "slot reserved" logs them (how=).
const (
	Fresh = "fresh" // its free dataset
	Spare = "spare" // the spare of a slot whose tenant ended
)

// Prep is one slot prepared, or being prepared, for the allocation Nomad
// placed on it. Asker, How and Began are set when it is made (New);
// Dataset, Armed and Err only by Finish, before Done is closed: read them
// only once Done is closed.
type Prep struct {
	Asker record.Owner // the allocation and task placed on the slot
	How   string       // Fresh or Spare
	Began time.Time    // when the view it was decided from began

	done chan struct{}

	Dataset string // the dataset reserved for Asker, never handed over
	// Armed: Dataset is armed by this run, and Asker is not recorded on
	// it: its Reserve answers before its proof (slots/proof.go).
	Armed bool
	Err   error
}

// New returns a preparation for asker, not finished.
func New(asker record.Owner, how string, began time.Time) *Prep {
	return &Prep{Asker: asker, How: how, Began: began, done: make(chan struct{})}
}

// Finish records how p's zfs work went, then closes Done. It is called
// once.
func (p *Prep) Finish(dataset string, armed bool, err error) {
	p.Dataset, p.Armed, p.Err = dataset, armed, err
	close(p.done)
}

// Done is closed once p's zfs work is over.
func (p *Prep) Done() <-chan struct{} { return p.done }

// Finished reports whether p's zfs work is over, and how it went.
func (p *Prep) Finished() (bool, error) {
	select {
	case <-p.done:
		return true, p.Err
	default:
		return false, nil
	}
}

// Record is the slots prepared, or being prepared, for the allocation
// Nomad placed on them: one part of the manager, with its own lock. mu
// guards byID and reserving; it is the last lock taken (no other is taken
// while it is held), and never held while anything else is locked or a
// command runs.
type Record struct {
	mu sync.Mutex
	// byID are the preparations not claimed by a Reserve yet, by slot ID.
	byID map[string]*Prep
	// reserving counts, by ID, the Reserves under way, during which no
	// preparation starts (Claim, Begin).
	reserving map[string]int
}

// NewRecord returns an empty record.
func NewRecord() *Record {
	return &Record{byID: map[string]*Prep{}, reserving: map[string]int{}}
}

// Of returns the preparation of slot id, or nil.
func (r *Record) Of(id string) *Prep {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// Start records p as the preparation of slot id, unless the slot has one
// already or a Reserve for it is under way; it reports whether it did.
func (r *Record) Start(id string, p *Prep) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID[id] != nil || r.reserving[id] > 0 {
		return false
	}
	r.byID[id] = p
	return true
}

// Drop forgets the preparation of slot id if it is still p (not claimed
// or replaced meanwhile); it reports whether it did.
func (r *Record) Drop(id string, p *Prep) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID[id] != p {
		return false
	}
	delete(r.byID, id)
	return true
}

// FinishedBefore returns, by slot ID, the preparations not claimed yet
// whose zfs work is over and went well, decided from a view that began
// before t.
func (r *Record) FinishedBefore(t time.Time) map[string]*Prep {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*Prep{}
	for id, p := range r.byID {
		if done, err := p.Finished(); done && err == nil && t.After(p.Began) {
			out[id] = p
		}
	}
	return out
}

// Claim marks a Reserve of ids under way (no preparation starts for them
// until release is called) and takes the preparations of ids, in the
// order of ids; ok is false when some id has none. release must be called
// once the Reserve is over.
func (r *Record) Claim(ids []string) (ps []*Prep, ok bool, release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok = true
	for _, id := range ids {
		r.reserving[id]++
		p := r.byID[id]
		delete(r.byID, id)
		if p == nil {
			ok = false
		}
		ps = append(ps, p)
	}
	return ps, ok, func() { r.End(ids) }
}

// Begin marks a Reserve of ids under way: no preparation starts for them
// until End(ids).
func (r *Record) Begin(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		r.reserving[id]++
	}
}

// End marks the Reserve of ids that Begin or Claim marked over.
func (r *Record) End(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if r.reserving[id]--; r.reserving[id] <= 0 {
			delete(r.reserving, id)
		}
	}
}
