package reconcile

import (
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// A slot has two dataset names, <class>/<index> and <class>/<index>.alt,
// and at most one dataset under each. While one serves (it is in use, or
// free and offered), the other is the slot's spare: a fresh dataset made
// in the background, so that the next tenant gets it at once (in memory
// when it is armed) while its predecessor's dataset is archived behind it. The roles swap at
// every such handover; neither name means anything by itself. A dataset on
// its way to the archive keeps its name until it is renamed; its name is
// then made again as the spare when the slot has none.
//
// Which dataset serves, and which is the spare, follows from the states
// ZFS records (pickPair): nothing about the pair is stored elsewhere.

// SlotNames returns the two dataset names of one slot: the first one, which
// a new slot is created under, and the alternate.
func (c Config) SlotNames(class string, index int) [2]string {
	first := c.SlotDataset(class, index)
	return [2]string{first, first + record.AltSuffix}
}

// NameKind is what sits under one of a slot's names.
type NameKind int

const (
	NameAbsent    NameKind = iota
	NameForeign            // unreadable, or not the plugin's: left alone
	NameFresh              // free: never handed over
	NameInUse              // reserved, or a state this build does not know
	NameReleasing          // on its way to the archive, or to be destroyed
)

func kindOf(d zfs.Dataset, exists bool) NameKind {
	switch {
	case !exists:
		return NameAbsent
	case d.Err != nil || !record.IsManaged(d, record.ManagedSlot):
		return NameForeign
	}
	switch record.Recorded(d) {
	case record.StateFree:
		return NameFresh
	case record.StateReleasing, record.StateDestroying, record.StateArchived:
		return NameReleasing
	}
	return NameInUse
}

// Pair is what ZFS shows under the two names of one slot: the names, the
// dataset under each (as read) and what it is.
type Pair struct {
	Names [2]string
	DS    [2]zfs.Dataset
	Kinds [2]NameKind
	// unrec: in use by a handover not recorded yet (unrecorded): this
	// run's, or, with earlier, maybe an earlier run's.
	unrec, earlier [2]bool
}

func PairOf(cfg Config, class string, index int, byName map[string]zfs.Dataset) Pair {
	p := Pair{Names: cfg.SlotNames(class, index)}
	for k, n := range p.Names {
		d, ok := byName[n]
		p.DS[k], p.Kinds[k] = d, kindOf(d, ok)
		p.unrec[k] = ok && p.Kinds[k] == NameInUse && armed.Unrecorded(d)
		p.earlier[k] = p.unrec[k] && armed.Unproven(d)
	}
	return p
}

// first returns the position of the first name of kind k, or -1.
func (p Pair) first(k NameKind) int {
	for i, x := range p.Kinds {
		if x == k {
			return i
		}
	}
	return -1
}

// Roles says which name serves (cur), which is the spare and which is on
// its way out (old); -1 for none. The first name decides when both could:
//   - a dataset in use serves; a fresh one beside it is the spare;
//   - otherwise a fresh dataset serves;
//   - otherwise a dataset being released stands for the slot;
//   - otherwise the first name, foreign or absent, does.
//
// Two datasets in use are a conflict (pairConflict names it; the first
// one serves) but in two cases, each from what this run knows:
//   - one was handed over by this run, and its record is not written yet
//     (unrec, not earlier), beside one whose owner is recorded: the first
//     is the spare handed over, and it serves; the second is old, the
//     dataset it replaced, whose fate is written behind the handover
//     (spare.Hander.HandOver: old in use is a fate due);
//   - one is an earlier run's, maybe handed over (earlier), beside one
//     that is not: the second serves, and the first is withheld, neither
//     handed over nor made again, until adoptWithheld proves that nobody
//     has it.
//
// A foreign first name stands for the slot whatever the alternate holds:
// the slot is someone else's, and left alone.
func (p Pair) Roles() (cur, spare, old, withheld int) {
	spare, old, withheld = -1, -1, -1
	if p.Kinds[0] == NameForeign {
		return 0, -1, -1, -1
	}
	other := func(i int) int {
		if i < 0 {
			return -1
		}
		return 1 - i
	}
	if i := p.fateDue(); i >= 0 {
		return i, -1, 1 - i, -1
	}
	if i := p.withheld(); i >= 0 {
		return 1 - i, -1, -1, i
	}
	switch {
	case p.first(NameInUse) >= 0:
		cur = p.first(NameInUse)
		if o := other(cur); p.Kinds[o] == NameFresh {
			spare = o
		} else if p.Kinds[o] == NameReleasing {
			old = o
		}
	case p.first(NameFresh) >= 0:
		cur = p.first(NameFresh)
		if o := other(cur); p.Kinds[o] == NameReleasing {
			old = o
		}
	case p.first(NameReleasing) >= 0:
		cur = p.first(NameReleasing)
		if o := other(cur); p.Kinds[o] == NameReleasing {
			old = o
		}
	default:
		cur = 0
	}
	return cur, spare, old, withheld
}

// fateDue returns the position of a dataset this run handed over, its
// record not written yet, beside one in use whose owner is recorded (see
// roles); -1 when the pair shows none.
func (p Pair) fateDue() int {
	for i := range p.Kinds {
		o := 1 - i
		if p.Kinds[i] == NameInUse && p.unrec[i] && !p.earlier[i] && p.Kinds[o] == NameInUse && !p.unrec[o] && armed.HasOwner(p.DS[o]) {
			return i
		}
	}
	return -1
}

// withheld returns the position of an earlier run's unproven dataset
// beside one in use that is not (see roles); -1 when the pair shows none.
func (p Pair) withheld() int {
	for i := range p.Kinds {
		o := 1 - i
		if p.Kinds[i] == NameInUse && p.earlier[i] && p.Kinds[o] == NameInUse && !p.earlier[o] {
			return i
		}
	}
	return -1
}

// Conflict returns why the pair cannot be served from, or "".
func (p Pair) Conflict() string {
	if p.Kinds[0] == NameInUse && p.Kinds[1] == NameInUse && p.fateDue() < 0 && p.withheld() < 0 {
		return "datasets " + p.Names[0] + " and " + p.Names[1] + " are both in use: both are kept, and neither is handed over until one is released"
	}
	return ""
}

// plan returns what the pair needs so that the slot has one fresh dataset
// (serving, or as the spare): the name to create, the name to destroy (a
// second fresh dataset), and whether each name being released is made
// again once it is renamed away. A foreign first name gets nothing, nor
// does a slot whose dataset in use was handed over by this run with no
// owner recorded yet.
func (p Pair) plan() (create, destroy string, remake [2]bool) {
	if p.Kinds[0] == NameForeign {
		return "", "", remake
	}
	switch {
	case p.Kinds[0] == NameFresh && p.Kinds[1] == NameFresh:
		destroy = p.Names[1]
	case p.first(NameFresh) >= 0:
	case p.unrec[0] || p.unrec[1]:
		// No spare beside a handover not recorded yet: a later run could
		// not tell the spare from the dataset handed over (package armed). It
		// is made once the owner is recorded (recordOwner).
	case p.first(NameAbsent) >= 0:
		// At once, beside a dataset in use or one being released (which
		// may take long: a process that keeps it open holds it up).
		create = p.Names[p.first(NameAbsent)]
	case p.first(NameReleasing) >= 0:
		remake[p.first(NameReleasing)] = true
	}
	return create, destroy, remake
}
