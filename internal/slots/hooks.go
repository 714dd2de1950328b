package slots

import "time"

// Outcomes of a Reserve, as told to an Observer.
const (
	// ReserveFresh: the slots were handed over at once (a fresh slot, the
	// slot's spare, or the slot back to its recorded owner), with no wait
	// for a release or for proof of who asks.
	ReserveFresh = "fresh"
	// ReserveWaited: Reserve had to wait (for a release, or for proof of
	// who asks) and then handed the slots over.
	ReserveWaited = "waited"
	// ReserveFailed: Reserve returned an error.
	ReserveFailed = "failed"
)

// Observer is told of Reserve calls and releases, for metrics. Its methods
// are called on the goroutines doing the work, with no lock of the manager
// held: they must be quick and must not block.
type Observer interface {
	// ReserveDone reports one Reserve: its outcome (ReserveFresh,
	// ReserveWaited or ReserveFailed) and how long it took.
	ReserveDone(outcome string, took time.Duration)
	// ReleaseStarted reports that the release of a dataset of a slot of
	// class has begun (its fate is recorded on ZFS).
	ReleaseStarted(class string)
	// ReleaseDone reports one release run of a slot of class that did
	// work: err is nil when the dataset was released, and took is how
	// long the run took, its waits for the slot included.
	ReleaseDone(class string, err error, took time.Duration)
}

// SetObserver sets what is told of Reserve calls and releases (nil for
// nothing). Set it before the manager is first used.
func (m *Manager) SetObserver(o Observer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.obs = o
}

// observer returns the observer, or nil.
func (m *Manager) observer() Observer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.obs
}

// observeRelease reports a release run of a slot of class, if an observer is set.
func (m *Manager) observeRelease(class string, err error, began time.Time) {
	if o := m.observer(); o != nil {
		o.ReleaseDone(class, err, time.Since(began))
	}
}

// ParentAvailable returns the parent dataset's available space (what the
// pool, and any quota on the parent, still lets the slots write) as read
// with the latest usage figures; known is false before the first read, or
// when the parent's figure did not parse. It runs no zfs command.
func (m *Manager) ParentAvailable() (bytes uint64, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.parentRoom.Bytes, m.parentRoom.Known
}
