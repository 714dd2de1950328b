package restore

import (
	"context"
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// InPlace gives the dataset of reserved slot s, whose owner has
// ended (decide said so, from a read that began after the Reserve
// arrived), to asker, the one other holder of the device and the same
// identity (SameIdentity): a replacement of the owner's allocation, in a
// class with restore on. One zfs command reads the data's lineage, one
// records the new owner and the lineage with the owner it leaves; the
// dataset is then mounted for it. It returns view.ErrChanged when the slot
// is no longer what s says.
func (r *Restorer) InPlace(ctx context.Context, s view.Slot, asker record.Owner) (view.Slot, error) {
	unlock, err := r.slots.Lock(ctx, s.ID, "hand over in place")
	if err != nil {
		return view.Slot{}, err
	}
	defer unlock()
	cur, ok := r.slots.Slot(s.ID)
	if !ok || !view.SameTenancy(cur, s) || cur.Old != nil {
		return view.Slot{}, view.ErrChanged
	}
	// Its data's lineage gains the owner it leaves (see into).
	p, err := r.zfs.GetExact(ctx, cur.Dataset, record.PropDataFrom)
	if err != nil {
		return view.Slot{}, fmt.Errorf("reading where the data of %s came from: %w", cur.Dataset, err)
	}
	var from record.Lineage
	if p.Source == "local" || p.Source == "received" {
		from, _ = record.ParseLineage(p.Value) // none known: the owner it leaves only
	}
	marks := map[string]string{record.PropOwner: asker.Encode(), record.PropDataFrom: from.Descend(cur.Owner.AllocID).Encode()}
	if err := r.zfs.SetMany(ctx, cur.Dataset, marks); err != nil {
		return view.Slot{}, fmt.Errorf("recording %s as the owner of %s: %w", asker, cur.Dataset, err)
	}
	r.slots.Forget(s.ID)
	r.slots.Update(s.ID, func(x *view.Slot) { x.Owner, x.Stamped = asker, asker })
	cur, _ = r.slots.Slot(s.ID)
	got, err := r.slots.MountLocked(ctx, cur)
	if err != nil {
		return view.Slot{}, fmt.Errorf("mounting %s for %s: %w", cur.Dataset, asker, err)
	}
	r.log.Info("slot reserved", "device", s.ID, "dataset", cur.Dataset, "owner", asker.String(), "how", "restored in place", "previous", s.Owner.String())
	return got, nil
}
