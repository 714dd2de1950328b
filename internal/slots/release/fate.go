package release

import (
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
)

// FateState is the state of a slot of class c whose release has begun.
func FateState(c reconcile.Class) record.State {
	if c.OnRelease == reconcile.OnReleaseDestroy {
		return record.StateDestroying
	}
	return record.StateReleasing
}

// FateEvent is the transition a release of a slot of class c records
// (record.Transitions): to the archive, or to be destroyed.
func FateEvent(c reconcile.Class) record.Event {
	if c.OnRelease == reconcile.OnReleaseDestroy {
		return record.ReleaseDestroy
	}
	return record.Release
}
