package slots

import "github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"

// What the manager asks of the node's allocations, declared in package
// allocs (which answers it from the allocation watcher: allocs.FromWatcher)
// and named here too, so that the manager's users need no other import.

// Nomad is what the manager needs to know of allocations (allocs.Nomad).
type Nomad = allocs.Nomad

// View is one read of the node's allocations.
type View = allocs.View

// Prior is what a read by ID says of an allocation another replaced.
type Prior = allocs.Prior

// Alloc is what a view says of one allocation.
type Alloc = allocs.Alloc

// Holding is one live allocation's task that holds a device.
type Holding = allocs.Holding
