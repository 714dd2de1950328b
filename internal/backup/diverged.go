package backup

// A fork of an identity's data: two allocations' data that went separate
// ways from a common point (record.Diverged). Neither a restore nor
// backup_dir's retention chooses between them.

import (
	"fmt"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// ErrDiverged says that an identity's data forked and no restore chooses a
// fork (see DivergedError); it is record.ErrDiverged, which the slots
// check: a restore then waits, whatever the class's restore setting.
var ErrDiverged = record.ErrDiverged

// ForkSide is one allocation's data in a fork: its newest copy.
type ForkSide struct {
	AllocID string
	// Where is its newest manifest, or the local archive.
	Where string
	// Node is the node it was taken on; "" for this node's archive.
	Node  string
	Taken time.Time
}

func (s ForkSide) String() string {
	node := "this node"
	if s.Node != "" {
		node = "node " + s.Node
	}
	return fmt.Sprintf("allocation %s's (%s, taken %s on %s)", s.AllocID, s.Where, s.Taken.UTC().Format(time.RFC3339), node)
}

// DivergedError is a restore refused because its identity's data forked
// at the newest (record.Diverged): Newest is the newest data by time,
// Other the other fork's newest. Successor says that Other restored from
// Newest's data and ran on (Newest came back late: a lost node, or Nomad
// kept it after a replacement); otherwise both were restored from the same
// data and both ran. Which the job wants cannot be told from the data.
type DivergedError struct {
	Identity  retention.Identity
	Newest    ForkSide
	Other     ForkSide
	Successor bool
}

func (e *DivergedError) Error() string {
	how := "is data that " + e.Other.String() + " restored from and then ran on"
	if !e.Successor {
		how = "and " + e.Other.String() + " were both restored from the same data, and both ran"
	}
	return fmt.Sprintf("the data of %s forked, and which fork the job wants cannot be known, so none is restored: the newest, %s, %s; "+
		"set one fork aside (docs/operations.md, \"A lost node that comes back\")", e.Identity, e.Newest, how)
}

// Unwrap makes errors.Is(err, ErrDiverged) hold.
func (e *DivergedError) Unwrap() error { return ErrDiverged }

// forkAt returns a *DivergedError when identity id's data forked at its
// newest: the later of newest (backup_dir's newest, of ms, the identity's
// manifests newest first) and local (the identity's newest local archive;
// zero Name: none). It is a pure function.
func forkAt(id retention.Identity, ms []Manifest, newest Manifest, local retention.Archive) error {
	left := make([]record.Left, 0, len(ms)+1)
	sides := map[string]ForkSide{}
	if local.Name != "" && local.AllocID != "" {
		left = append(left, record.Left{AllocID: local.AllocID, From: local.From, Taken: local.ReleasedAt})
		sides[local.AllocID] = ForkSide{AllocID: local.AllocID, Where: "the local archive " + local.Name, Taken: local.ReleasedAt}
	}
	for _, m := range ms {
		left = append(left, record.Left{AllocID: m.AllocID, From: m.From, Taken: m.ReleasedAt})
		if s, ok := sides[m.AllocID]; !ok || m.ReleasedAt.After(s.Taken) {
			sides[m.AllocID] = ForkSide{AllocID: m.AllocID, Where: m.Path(), Node: orNone(m.Node), Taken: m.ReleasedAt}
		}
	}
	at := newest.AllocID
	if !newerThanLocal(newest, local) {
		at = local.AllocID
	}
	other, successor, ok := record.Diverged(left, at)
	if !ok {
		return nil
	}
	return &DivergedError{Identity: id, Newest: sides[at], Other: sides[other], Successor: successor}
}

// forked reports whether the identity whose manifests are ms (newest
// first) forked at its newest stream: backup_dir's retention then deletes
// none of its chains, whichever fork they hold.
func forked(ms []Manifest) bool {
	return len(ms) > 0 && forkAt(retention.Identity{}, ms, ms[0], retention.Archive{}) != nil
}
