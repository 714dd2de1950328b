package slots

// The slots' locks and versions.

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// slotLock returns the lock that serialises zfs work on slot id: a
// channel of capacity one, held while it holds a value, so that a wait for
// it ends with the waiter's context.
func (m *Manager) slotLock(id string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.locks[id]
	if !ok {
		l = make(chan struct{}, 1)
		m.locks[id] = l
	}
	return l
}

// lockSlot takes treeMu for reading and the slot's lock, for slot work
// (what names it in the log), waiting for the slot's lock at most until ctx
// is done (a free lock is taken even then); the returned function releases
// both. While the proof behind a prepared slot's Reserve is under way
// (proof.go), it waits for that proof too, as long as ctx allows: no work
// touches the slot until the proof has answered. A wait of a millisecond
// or more is logged at TRACE with what held the lock when the wait began.
func (m *Manager) lockSlot(ctx context.Context, id, what string) (unlock func(), err error) {
	for {
		unlock, proof, err := m.lockSlotOnce(ctx, id, what)
		if err != nil || proof == nil {
			return unlock, err
		}
		began := time.Now()
		select {
		case <-proof:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the proof of the slot's asker: %w", ctx.Err())
		}
		m.log.Trace("waited for the proof of the slot's asker", "device", id, "for", what, "waited", time.Since(began))
	}
}

// lockSlotOnce is one try of lockSlot: the locks, or, when a proof is
// under way on the slot, none and the proof's gate to wait for.
func (m *Manager) lockSlotOnce(ctx context.Context, id, what string) (unlock func(), proof <-chan struct{}, err error) {
	m.treeMu.RLock()
	l := m.slotLock(id)
	select {
	case l <- struct{}{}:
	default:
		m.mu.Lock()
		behind := m.holder[id]
		m.mu.Unlock()
		began := time.Now()
		select {
		case l <- struct{}{}:
		case <-ctx.Done():
			m.treeMu.RUnlock()
			return nil, nil, fmt.Errorf("waiting for other work on the slot (%s): %w", view.OrDash(behind), ctx.Err())
		}
		if waited := time.Since(began); waited >= time.Millisecond {
			m.log.Trace("waited for the slot's lock", "device", id, "for", what, "behind", behind, "waited", waited)
		}
	}
	m.mu.Lock()
	if gate := m.proofs.Of(id); gate != nil {
		m.mu.Unlock()
		<-l
		m.treeMu.RUnlock()
		return nil, gate, nil
	}
	m.busy[id]++
	m.holder[id] = what
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		m.busy[id]--
		delete(m.holder, id)
		m.mu.Unlock()
		<-l
		m.treeMu.RUnlock()
	}, nil, nil
}

// tryLockSlot is lockSlot for Sync: it takes the locks only when they are
// free and no run works on the slot (a run may work on the slot's old
// dataset without its lock: see tend.outside) other than mine, and no
// proof is under way on it (proof.go); it does not count as slot work.
func (m *Manager) tryLockSlot(id, mine string) (unlock func(), ok bool) {
	if !m.treeMu.TryRLock() {
		return nil, false
	}
	l := m.slotLock(id)
	select {
	case l <- struct{}{}:
	default:
		m.treeMu.RUnlock()
		return nil, false
	}
	m.mu.Lock()
	running := m.runs.Running(id) && id != mine || m.proofs.Under(id) // a proof: see lockSlot
	if !running {
		m.holder[id] = "sync"
	}
	m.mu.Unlock()
	if running {
		<-l
		m.treeMu.RUnlock()
		return nil, false
	}
	return func() {
		m.mu.Lock()
		delete(m.holder, id)
		m.mu.Unlock()
		<-l
		m.treeMu.RUnlock()
	}, true
}

// version returns the version of one slot.
func (m *Manager) version(id string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vers[id]
}

// versions returns a copy of vers.
func (m *Manager) versions() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.vers)
}
