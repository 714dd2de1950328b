package view

import (
	"errors"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// ErrChanged says that the slot changed since the caller read its view and
// decided from it: decide again. The manager's work on one slot, and the
// parts it calls (package restore), return it wrapped.
var ErrChanged = errors.New("the slot changed since it was read")

// SameTenancy reports whether slot view cur still shows the tenancy that a
// decision was made from (s): the same dataset, reserved, by the same
// owner. What else may have changed since (the owner recorded, a spare
// made, a remount) does not bear on the decision.
func SameTenancy(cur, s Slot) bool {
	return cur.Dataset == s.Dataset && cur.State == record.StateReserved && s.State == record.StateReserved && cur.Owner.AllocID == s.Owner.AllocID
}
