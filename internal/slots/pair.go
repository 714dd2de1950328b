package slots

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

// nameKind is what sits under one of a slot's names.
type nameKind int

const (
	nameAbsent    nameKind = iota
	nameForeign            // unreadable, or not the plugin's: left alone
	nameFresh              // free: never handed over
	nameInUse              // reserved, or a state this build does not know
	nameReleasing          // on its way to the archive, or to be destroyed
)

func kindOf(d zfs.Dataset, exists bool) nameKind {
	switch {
	case !exists:
		return nameAbsent
	case d.Err != nil || !record.IsManaged(d, record.ManagedSlot):
		return nameForeign
	}
	switch record.Recorded(d) {
	case record.StateFree:
		return nameFresh
	case record.StateReleasing, record.StateDestroying, record.StateArchived:
		return nameReleasing
	}
	return nameInUse
}

// pair is what ZFS shows under the two names of one slot.
type pair struct {
	names [2]string
	ds    [2]zfs.Dataset
	kinds [2]nameKind
	// unrec: in use by a handover not recorded yet (unrecorded): this
	// run's, or, with earlier, maybe an earlier run's.
	unrec, earlier [2]bool
}

func pairOf(cfg Config, class string, index int, byName map[string]zfs.Dataset) pair {
	p := pair{names: cfg.SlotNames(class, index)}
	for k, n := range p.names {
		d, ok := byName[n]
		p.ds[k], p.kinds[k] = d, kindOf(d, ok)
		p.unrec[k] = ok && p.kinds[k] == nameInUse && armed.Unrecorded(d)
		p.earlier[k] = p.unrec[k] && armed.Unproven(d)
	}
	return p
}

// first returns the position of the first name of kind k, or -1.
func (p pair) first(k nameKind) int {
	for i, x := range p.kinds {
		if x == k {
			return i
		}
	}
	return -1
}

// roles says which name serves (cur), which is the spare and which is on
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
//     (handOverSpare: old in use is a fate due);
//   - one is an earlier run's, maybe handed over (earlier), beside one
//     that is not: the second serves, and the first is withheld, neither
//     handed over nor made again, until adoptWithheld proves that nobody
//     has it.
//
// A foreign first name stands for the slot whatever the alternate holds:
// the slot is someone else's, and left alone.
func (p pair) roles() (cur, spare, old, withheld int) {
	spare, old, withheld = -1, -1, -1
	if p.kinds[0] == nameForeign {
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
	case p.first(nameInUse) >= 0:
		cur = p.first(nameInUse)
		if o := other(cur); p.kinds[o] == nameFresh {
			spare = o
		} else if p.kinds[o] == nameReleasing {
			old = o
		}
	case p.first(nameFresh) >= 0:
		cur = p.first(nameFresh)
		if o := other(cur); p.kinds[o] == nameReleasing {
			old = o
		}
	case p.first(nameReleasing) >= 0:
		cur = p.first(nameReleasing)
		if o := other(cur); p.kinds[o] == nameReleasing {
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
func (p pair) fateDue() int {
	for i := range p.kinds {
		o := 1 - i
		if p.kinds[i] == nameInUse && p.unrec[i] && !p.earlier[i] && p.kinds[o] == nameInUse && !p.unrec[o] && armed.HasOwner(p.ds[o]) {
			return i
		}
	}
	return -1
}

// withheld returns the position of an earlier run's unproven dataset
// beside one in use that is not (see roles); -1 when the pair shows none.
func (p pair) withheld() int {
	for i := range p.kinds {
		o := 1 - i
		if p.kinds[i] == nameInUse && p.earlier[i] && p.kinds[o] == nameInUse && !p.earlier[o] {
			return i
		}
	}
	return -1
}

// conflict returns why the pair cannot be served from, or "".
func (p pair) conflict() string {
	if p.kinds[0] == nameInUse && p.kinds[1] == nameInUse && p.fateDue() < 0 && p.withheld() < 0 {
		return "datasets " + p.names[0] + " and " + p.names[1] + " are both in use: both are kept, and neither is handed over until one is released"
	}
	return ""
}

// plan returns what the pair needs so that the slot has one fresh dataset
// (serving, or as the spare): the name to create, the name to destroy (a
// second fresh dataset), and whether each name being released is made
// again once it is renamed away. A foreign first name gets nothing, nor
// does a slot whose dataset in use was handed over by this run with no
// owner recorded yet.
func (p pair) plan() (create, destroy string, remake [2]bool) {
	if p.kinds[0] == nameForeign {
		return "", "", remake
	}
	switch {
	case p.kinds[0] == nameFresh && p.kinds[1] == nameFresh:
		destroy = p.names[1]
	case p.first(nameFresh) >= 0:
	case p.unrec[0] || p.unrec[1]:
		// No spare beside a handover not recorded yet: a later run could
		// not tell the spare from the dataset handed over (armed.go). It
		// is made once the owner is recorded (recordOwner).
	case p.first(nameAbsent) >= 0:
		// At once, beside a dataset in use or one being released (which
		// may take long: a process that keeps it open holds it up).
		create = p.names[p.first(nameAbsent)]
	case p.first(nameReleasing) >= 0:
		remake[p.first(nameReleasing)] = true
	}
	return create, destroy, remake
}
