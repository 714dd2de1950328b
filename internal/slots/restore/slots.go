// Package restore gives the asker of a Reserve, in a class with restore
// on, the data its identity left: an archive renamed into a fresh slot's
// other name (Fresh), or the dataset of an ended allocation handed in
// place to its replacement (InPlace). It reaches the manager's slots
// through Slots, which the manager implements, and ZFS through ZFS; it
// owns where archives are found (SetArchives), under a lock of its own.
package restore

import (
	"context"
	"sync"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Archives finds the archived data of an identity for a restore, and holds
// it against retention while the restore runs. *retention.Pruner
// implements it.
type Archives interface {
	// Claim returns the archives of owner o's identity in class (its
	// namespace, job, group, task and allocation index) left by the
	// identity's newest released allocation, in the order of the slots
	// they came from; none when there are none. from is the lineage their data has once restored
	// (record.PropDataFrom), recorded on the slot's dataset with its new
	// owner. They are not pruned until release is called, which the
	// caller must do. after, when its Alloc is not "", is the data of o's
	// identity from another node that must be what is restored (o's
	// predecessor's, which ran there): while neither the archive nor
	// backup_dir holds it, the error wraps record.ErrNotArrived.
	Claim(ctx context.Context, class string, o record.Owner, after record.Awaited) (names []string, from record.Lineage, release func(), err error)
}

// ZFS is what a restore asks of ZFS (the manager's, which reads as its run
// reads).
type ZFS interface {
	GetExact(ctx context.Context, name, prop string) (zfs.Prop, error)
	SetMany(ctx context.Context, name string, props map[string]string) error
	Rename(ctx context.Context, from, to string) error
}

// Slots is what a restore asks of the manager's slots.
type Slots interface {
	// Lock takes slot id's lock for what (named in the log of a wait for
	// it), waiting until ctx is done.
	Lock(ctx context.Context, id, what string) (unlock func(), err error)
	// Slot returns the current view of one slot; All, of every slot.
	Slot(id string) (view.Slot, bool)
	All() []view.Slot
	// Update changes one slot's view and publishes the change.
	Update(id string, fn func(*view.Slot))
	// MountLocked mounts slot s for its owner with the class's flags and
	// readies its root; the caller holds the slot's lock.
	MountLocked(ctx context.Context, s view.Slot) (view.Slot, error)
	// Config is the configuration the manager works to.
	Config() reconcile.Config
	// SetIncomplete says why the latest allocation read may miss
	// allocations ("" when it sees them all).
	SetIncomplete(why string)
	// Kick wakes the release pass.
	Kick()
	// Forget drops what the manager knows of slot id's previous tenant
	// beyond ZFS (an owner not yet recorded, a note, why it started
	// empty): its dataset was handed over in place.
	Forget(id string)
}

// Restorer restores archives into slots for the manager.
type Restorer struct {
	zfs   ZFS
	slots Slots
	log   hclog.Logger

	mu sync.Mutex // guards archives
	// archives finds what a restore brings back (SetArchives); nil for none.
	archives Archives
}

// New returns a restorer that works on slots through s and on ZFS through z.
func New(z ZFS, s Slots, log hclog.Logger) *Restorer {
	return &Restorer{zfs: z, slots: s, log: log}
}

// SetArchives sets where Fresh finds archives to restore (nil for none).
func (r *Restorer) SetArchives(a Archives) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.archives = a
}
