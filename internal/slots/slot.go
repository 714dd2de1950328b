package slots

import "github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"

// Slot is one device instance as last observed (view.Slot: the slot list
// and each slot's health are derived there, from the configuration and
// one read of ZFS), named here too, so that the manager's users need no
// other import.
type Slot = view.Slot
