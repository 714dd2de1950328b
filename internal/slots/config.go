package slots

import "github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"

// The configuration the manager works to, and the values its users name,
// declared with the pure reconcile (package reconcile) and named here too,
// so that the manager's users need no other import.

// Config is the validated configuration the manager works to.
type Config = reconcile.Config

// Class is one validated class of the operator's configuration.
type Class = reconcile.Class

// Restore values: what Reserve does when the asker's identity has an
// archive (see package restore).
const (
	RestoreOff        = reconcile.RestoreOff
	RestoreBestEffort = reconcile.RestoreBestEffort
	RestoreRequired   = reconcile.RestoreRequired
)

// OnRelease values: what happens to a dataset once its allocation is over.
const (
	OnReleaseArchive = reconcile.OnReleaseArchive
	OnReleaseDestroy = reconcile.OnReleaseDestroy
)

// ObservedProps are the properties read by the one batched `zfs get` of
// every refresh (reconcile.ObservedProps).
var ObservedProps = reconcile.ObservedProps
