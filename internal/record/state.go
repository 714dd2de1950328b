package record

import (
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// State is the durable state of a slot, stored in PropState. Every change
// of it is a row of Transitions (transitions.go).
type State string

const (
	// StateFree: an empty dataset waiting for a task.
	StateFree State = "free"
	// StateReserved: Nomad has called Reserve for it.
	StateReserved State = "reserved"
	// StateReleasing: its allocation is over; it is on its way to the
	// archive. StateDestroying: the same, to be destroyed once there.
	// On ZFS, a release to the archive writes StateArchived at once (the
	// dataset's fate, so that the rename into the archive is the last
	// step and no command follows it); "releasing" is what earlier
	// builds wrote, and is still read. In the slot list, a slot's
	// dataset recorded "archived" or "releasing" is StateReleasing.
	StateReleasing  State = "releasing"
	StateDestroying State = "destroying"
	// StateArchived: released and kept under <parent>/.archive, or on its
	// way there (see StateReleasing).
	StateArchived State = "archived"
	// StateArmed names, in Transitions, the stored value
	// ArmedValue(token) ("armed:<run>.<n>"): a fresh dataset made by one
	// plugin run. It is never stored alone, and never a slot's State in
	// memory: StateOf reads an armed dataset as free, or reserved once
	// an owner is recorded.
	StateArmed State = "armed"
)

// armedPrefix begins the stored state of an armed dataset.
const armedPrefix = string(StateArmed) + ":"

// ArmedValue is the PropState value of a dataset armed with token.
func ArmedValue(token string) string { return armedPrefix + token }

// ArmedToken returns the token of an armed stored state; "", false for
// any other state.
func ArmedToken(stored string) (string, bool) {
	token, ok := strings.CutPrefix(stored, armedPrefix)
	if !ok {
		return "", false
	}
	return token, true
}

// StateOf is what a slot dataset's stored state (PropState) and owner
// (PropOwner, "" when unset) mean to a reader outside the plugin (the
// operator CLI, tests): an armed dataset is free, or reserved once an owner
// is recorded; any other state is itself. An armed dataset the running
// plugin has just handed over shows free until the plugin records the
// handover: a moment after the Reserve, or, for a spare handed over while
// ZFS refuses the fate of the dataset it replaces (a full pool), once ZFS
// accepts it.
func StateOf(stored, owner string) State {
	if _, armed := ArmedToken(stored); armed {
		if owner != "" && owner != "-" {
			return StateReserved
		}
		return StateFree
	}
	return State(stored)
}

// Recorded returns the state recorded on d as it is stored (an armed
// state is not decoded: see StateOf), or "" when none is set.
func Recorded(d zfs.Dataset) State {
	v, _ := d.Local(PropState)
	return State(v)
}

// FateOf is what a slot being released records as its state on ZFS: the
// dataset's fate. A release to the archive records StateArchived at once
// (see StateReleasing); any other state is itself.
func FateOf(state State) State {
	if state == StateReleasing {
		return StateArchived
	}
	return state
}
