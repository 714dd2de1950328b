package record

import "fmt"

// Every change of a slot dataset's recorded state (PropState), in one
// table. docs/release-lifecycle.md ("Transitions") shows the same table;
// TestTransitions_MatchTheDocs holds the two together. Code that writes a
// state writes To(event), so each write is one of these rows.

// Event names what changes a slot dataset's recorded state.
type Event string

const (
	Create          Event = "create"
	Arm             Event = "arm"
	Reserve         Event = "reserve"
	RecordHandover  Event = "record handover"
	Unmark          Event = "unmark"
	Disarm          Event = "disarm"
	Release         Event = "release"
	ReleaseDestroy  Event = "release to destroy"
	Upgrade         Event = "upgrade"
	Restore         Event = "restore"
	RestoreUndone   Event = "restore undone"
	DestroyReleased Event = "destroy"
	Prune           Event = "prune"
)

// Transition is one row of the table: Event moves a dataset recorded in
// one of From to To. A From of "" is a dataset that does not exist yet; a
// To of "" is one that no longer exists.
type Transition struct {
	Event Event
	From  []State
	To    State
	// By says what in the plugin does it.
	By string
}

// Transitions is every change of a recorded state the plugin makes.
var Transitions = []Transition{
	{Create, []State{""}, StateFree,
		"a new slot dataset that is not armed: encrypted, a clone, or made while the allocation views are incomplete"},
	{Arm, []State{""}, StateArmed,
		"a new slot dataset made by this plugin run: free to it until handed over"},
	{Reserve, []State{StateFree}, StateReserved,
		"Reserve, a preparation at placement, or a spare's handover marks a free dataset; an armed one gets its owner recorded instead and keeps its state"},
	{RecordHandover, []State{StateArmed}, StateReserved,
		"an armed dataset handed over to an allocation whose owner is not known"},
	{Unmark, []State{StateReserved}, StateFree,
		"a Reserve's mark taken back when its asker does not get the dataset"},
	{Disarm, []State{StateArmed}, StateFree,
		"a free armed dataset of this run, once the allocation views are found incomplete (a later run could not adopt it)"},
	{Release, []State{StateFree, StateReserved, StateArmed}, StateArchived,
		"the release of a dataset whose class has on_release = \"archive\", written before the rename into the archive"},
	{ReleaseDestroy, []State{StateFree, StateReserved, StateArmed}, StateDestroying,
		"the release of a dataset whose class has on_release = \"destroy\""},
	{Upgrade, []State{StateReleasing}, StateArchived,
		"a release that an earlier build recorded releasing"},
	{Restore, []State{StateArchived}, StateReserved,
		"an archive renamed back into a slot for its identity's new allocation"},
	{RestoreUndone, []State{StateReserved}, StateArchived,
		"a restore whose rename is taken back: the archive returns, data and all"},
	{DestroyReleased, []State{StateDestroying}, "",
		"the destroy of a released dataset (its key removed after it)"},
	{Prune, []State{StateArchived}, "",
		"retention destroys an archive (keep, max_age, archive_quota)"},
}

// To returns the state that event e records. An event not in Transitions
// is a programming error: To panics, and every write site's test finds it.
func To(e Event) State {
	for _, t := range Transitions {
		if t.Event == e {
			return t.To
		}
	}
	panic(fmt.Sprintf("record: no transition for event %q", e))
}
