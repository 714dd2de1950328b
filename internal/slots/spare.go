package slots

// A slot's spare handed over is package spare's (m.spares.HandOver);
// this file is the manager's side of it.

import (
	"context"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/release"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// errChanged: the slot changed since the caller decided; decide again
// (view.ErrChanged, which package restore returns too).
var errChanged = view.ErrChanged

// sameTenancy is view.SameTenancy: the slot still shows the tenancy a
// decision was made from.
func sameTenancy(cur, s Slot) bool { return view.SameTenancy(cur, s) }

// spareSlots is the manager's side of package spare (spare.Slots).
type spareSlots struct{ fateSlots }

func (h spareSlots) Lock(ctx context.Context, id, what string) (func(), error) {
	return h.m.lockSlot(ctx, id, what)
}

func (h spareSlots) WriteBackFree(ctx context.Context, id, dataset string) error {
	return h.m.writeBackFree(ctx, id, dataset)
}

func (h spareSlots) ReleaseOld(ctx context.Context, now Slot, r *release.Run, unlock func()) error {
	rs := now.Old
	return h.m.tendSlotLocked(ctx, now, tend{focus: rs.Dataset, first: h.m.knownRelease(now, *rs, record.Owner{}), outside: true, run: r}, unlock)
}

func (h spareSlots) Observe(class string, err error, began time.Time) {
	h.m.observeRelease(class, err, began)
}
