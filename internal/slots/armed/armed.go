// Package armed holds what a run of the plugin knows of armed datasets: a
// fresh slot handed over with no zfs command.
//
// A fresh slot dataset is created in state "armed:<run>.<n>" rather than
// "free": <run> names the plugin process that made it (a random ID drawn
// when the manager is made), <n> tells its datasets apart. The state says
// "this dataset may have been handed over by run <run> with nothing
// recorded yet". So:
//
//   - to the run that armed it, it is free until that run hands it over,
//     which the run remembers in memory (Tracker.handed) and records on ZFS
//     behind the Reserve, with the owner (recordOwner): the Reserve itself
//     runs no zfs command;
//   - with an owner recorded, it is reserved by that owner, whoever reads it;
//   - to any other run (the plugin restarted, maybe after a crash between a
//     handover and its record), it is reserved by an unknown allocation:
//     kept until proven otherwise. The proof (adopt) is that a complete
//     read of the node's allocations, begun after this run started, shows
//     no allocation holding the device but, at most, one that has not
//     started, and that the dataset's root is empty: nobody has it, and
//     nobody left anything in it. The run then takes the dataset for its
//     own, in memory, and offers it as fresh.
//
// Every read of ZFS by the manager goes through Normalize, which rewrites an
// armed state to the state it means to this run ("free" or "reserved"), and
// adds PropArmed (never stored on ZFS) with the token, so that the rest of
// the manager sees the slot states it always did. A dataset written by a
// version before this one is never armed; an earlier version that reads an
// armed dataset finds an unknown state and leaves the dataset alone.
package armed

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// PropArmed is added to a dataset as read by the manager when ZFS shows it
// armed: its token ("<run>.<n>"). It is never stored on ZFS.
const PropArmed = "nomad-device-zfs:armed-token"

// PropEarlier is added, as PropArmed is, to an armed dataset with no owner
// that an earlier run made and this run has not adopted: it may have been
// handed over. It is never stored on ZFS.
const PropEarlier = "nomad-device-zfs:armed-earlier"

// Tracker is what this run knows of armed datasets.
type Tracker struct {
	run     string        // this run's ID
	started time.Time     // when this run began
	seq     atomic.Uint64 // numbers this run's tokens
	// incomplete: the latest allocation view may miss namespaces (see
	// Arm).
	incomplete atomic.Bool
	// mu guards handed and adopted.
	mu sync.Mutex
	// handed are the armed datasets this run handed over with no owner
	// recorded on ZFS yet, by token: the dataset's name then, and when.
	handed map[string]handover
	// adopted are the tokens of earlier runs proven fresh (adopt).
	adopted map[string]bool
	// made are the tokens of the datasets this run made armed, by name:
	// the latest made under each name.
	made map[string]string
}

type handover struct {
	dataset string
	at      time.Time
}

func New() *Tracker {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("reading random bytes: " + err.Error()) // crypto/rand does not fail on Linux
	}
	return &Tracker{run: hex.EncodeToString(b[:]), started: time.Now(), handed: map[string]handover{}, adopted: map[string]bool{}, made: map[string]string{}}
}

// token returns a new token of this run.
func (a *Tracker) Token() string {
	return a.run + "." + strconv.FormatUint(a.seq.Add(1), 10)
}

// TokenOf returns the token of the dataset this run made armed as name
// latest, or "" when it made none.
func (a *Tracker) TokenOf(name string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.made[name]
}

// current reports whether token is that of the dataset this run last made
// under name, or one not made by this run (an earlier run's, adopted): a
// slot view whose token is not current is older than the dataset now under
// its name (destroyed and made again since).
func (a *Tracker) Current(name, token string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.currentLocked(name, token)
}

// currentLocked is current; mu is held.
func (a *Tracker) currentLocked(name, token string) bool {
	made, ok := a.made[name]
	return !ok || made == token
}

// claim records that this run hands over the armed dataset with token,
// under name, when token is current (see current); it reports whether it
// did. The check and the record are one step under mu.
func (a *Tracker) Claim(name, token string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.currentLocked(name, token) {
		return false
	}
	a.handed[token] = handover{dataset: name, at: time.Now()}
	return true
}

// ours reports whether token is this run's own, or adopted.
func (a *Tracker) Ours(token string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mineLocked(token)
}

// mineLocked reports whether token is one this run may hand over as fresh
// until it does: its own, or adopted. mu is held.
func (a *Tracker) mineLocked(token string) bool {
	run, _, _ := strings.Cut(token, ".")
	return run == a.run || a.adopted[token]
}

// isHanded reports whether token was handed over by this run and its
// record has not been seen on ZFS yet. mu is held.
func (a *Tracker) isHanded(token string) bool {
	_, ok := a.handed[token]
	return ok
}

// handOver records that this run handed over the armed dataset with token.
func (a *Tracker) HandOver(token, dataset string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handed[token] = handover{dataset: dataset, at: time.Now()}
}

// adopt takes an earlier run's armed dataset for this run's own.
func (a *Tracker) Adopt(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.adopted[token] = true
}

// outstanding is the number of handovers not yet recorded on ZFS.
func (a *Tracker) Outstanding() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.handed)
}

// HasOwner reports whether d records an owner: PropOwner, or the
// allocation ID of the legacy properties (what an owner is known by).
func HasOwner(d zfs.Dataset) bool {
	for _, p := range []string{record.PropOwner, record.LegacyOwnerProps[0]} {
		if _, ok := d.Local(p); ok {
			return true
		}
	}
	return false
}

// Normalize rewrites, in ds as read at began, each armed state to what it
// means to this run (see the top of the file); a nil a reads as an outside
// observer (the operator CLI), to whom an armed dataset with no owner is
// free. It forgets the handovers the read shows recorded or gone: ds is
// the whole of what a read of under (depth: see ZFS.Get) returned.
//
// An earlier run's armed dataset with no owner (unproven) also gets
// PropEarlier. Beside a dataset in use it is most likely that dataset's
// spare, but not surely: an armed spare is handed over in memory, and the
// fate of the dataset it replaces is written behind the handover
// (spare.Hander.HandOver), so a run stopped in between leaves exactly this. It is
// withheld (reconcile.Pair), and adopted only on proof (adoptWithheld).
//
// Only positive evidence forgets a handover: a read that showed its owner,
// or a whole read (clean: no error, depth > 0, every dataset parsed) begun
// after it, of the tree the dataset was in, that does not show its token.
func (a *Tracker) Normalize(ds []zfs.Dataset, began time.Time, under string, depth int, clean bool) []zfs.Dataset {
	if a != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
	}
	out, copied := ds, false
	clean = clean && depth != 0 && a != nil
	for _, d := range ds {
		// A dataset that did not parse may have taken other datasets'
		// lines with it: the read is no proof that any is gone.
		clean = clean && d.Err == nil
	}
	seen := map[string]bool{} // tokens in the read
	for i, d := range ds {
		v, ok := d.Local(record.PropState)
		if !ok {
			continue
		}
		token, armed := record.ArmedToken(v)
		if !armed {
			continue
		}
		seen[token] = true
		owned := HasOwner(d)
		state, earlier := record.StateFree, false
		switch {
		case owned:
			state = record.StateReserved
			if a != nil {
				delete(a.handed, token) // recorded
			}
		case a == nil:
		case a.isHanded(token):
			state = record.StateReserved
		case !a.mineLocked(token):
			state, earlier = record.StateReserved, true // an earlier run may have handed it over
		}
		if !copied {
			out, copied = append([]zfs.Dataset(nil), ds...), true
		}
		props := maps.Clone(d.Props)
		p := props[record.PropState]
		p.Value = string(state)
		props[record.PropState] = p
		if !owned {
			// Its handover is not recorded (or it was never handed over):
			// the token says by which run.
			props[PropArmed] = zfs.Prop{Value: token, Source: p.Source}
		}
		if earlier {
			props[PropEarlier] = zfs.Prop{Value: "yes", Source: p.Source}
		}
		out[i].Props = props
	}
	if !clean {
		return out
	}
	for token, h := range a.handed {
		if seen[token] || !h.at.Before(began) || !strings.HasPrefix(h.dataset, under+"/") {
			continue
		}
		if depth > 0 && strings.Count(strings.TrimPrefix(h.dataset, under+"/"), "/")+1 > depth {
			continue
		}
		// A whole read, begun after the handover, of where the dataset
		// was shows it no longer armed there, or gone: its record
		// landed, or it was released.
		delete(a.handed, token)
	}
	return out
}

// Arm returns the props of dataset name with a free state replaced by a
// new armed one, and remembers its token (TokenOf). An encrypted dataset
// is made free, as are all while the allocation views are known to be
// incomplete (a token that does not see every namespace): a later run
// could not adopt them (adoptArmed: an encrypted dataset is not mounted
// after a reboot; no incomplete view proves that nobody holds a device).
// Clones are never armed (a clone is never empty): the manager's ZFS arms
// only what it creates (Create).
func (a *Tracker) Arm(name string, props map[string]string) map[string]string {
	if props[record.PropState] != string(record.StateFree) || props[record.PropManaged] != record.ManagedSlot || props["encryption"] != "" || a.incomplete.Load() {
		return props
	}
	token := a.Token()
	a.mu.Lock()
	a.made[name] = token
	a.mu.Unlock()
	props = maps.Clone(props)
	props[record.PropState] = record.ArmedValue(token) // record.Arm: StateArmed
	return props
}

// Started returns when this run began: a view of the allocations begun
// before it proves nothing of an earlier run's armed datasets.
func (a *Tracker) Started() time.Time { return a.started }

// SetIncomplete says whether the latest allocation view may miss
// namespaces: while it may, Arm makes datasets free.
func (a *Tracker) SetIncomplete(incomplete bool) { a.incomplete.Store(incomplete) }

// Incomplete reports what SetIncomplete said last.
func (a *Tracker) Incomplete() bool { return a.incomplete.Load() }

// Unrecorded reports whether d, as the manager reads it, is in use by a
// handover of an armed dataset that ZFS does not record yet: reserved,
// armed, no owner.
func Unrecorded(d zfs.Dataset) bool {
	_, armed := d.Local(PropArmed)
	return armed && record.Recorded(d) == record.StateReserved && !HasOwner(d)
}

// Unproven reports whether d, as the manager reads it, is an earlier run's
// armed dataset with no owner that this run has not adopted (PropEarlier):
// it may have been handed over.
func Unproven(d zfs.Dataset) bool {
	_, ok := d.Local(PropEarlier)
	return ok && Unrecorded(d)
}
