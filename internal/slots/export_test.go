package slots

import (
	"context"
	"time"
)

// SetSpareHold sets how long a kicked release pass holds a slot for its
// next tenant (hold.Default otherwise), for tests whose steps between
// the pass and the Reserve take real zfs commands: on a busy machine those
// can outlast the default. It applies to holds under way too (their time
// left is counted from when their owner's end was seen).
func (m *Manager) SetSpareHold(d time.Duration) {
	m.holds.Set(d)
}

// HeldForNext reports whether slot id is held for its next tenant now: a
// kicked pass found its owner ended less than the hold ago (holdFor).
func (m *Manager) HeldForNext(id string) bool {
	return m.holds.Holding(id, "")
}

// SetProofGrace bounds the proof behind a prepared slot's Reserve
// (identifyGrace otherwise), for tests that hold that read open while they
// show what waits for it.
func (m *Manager) SetProofGrace(d time.Duration) {
	m.proofs.SetGrace(d)
}

// WaitProofs returns once no proof behind a prepared slot's Reserve is
// under way (proof.go), or with ctx's error.
func (m *Manager) WaitProofs(ctx context.Context) error { return m.awaitProofs(ctx, nil) }
