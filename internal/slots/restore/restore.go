package restore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Outcome is what Fresh did with the fresh slots of one Reserve.
type Outcome struct {
	// Restored are the slots handed over with their archive.
	Restored []view.Slot
	// Fresh are the IDs left to reserve empty.
	Fresh []string
	// Notes are, by ID, why a best-effort restore started empty.
	Notes map[string]string
	// Wait is why the Reserve must wait: a required restore that cannot be
	// done, or an archive waiting for its slot (and Renew: for a new read).
	Wait  string
	Renew bool
}

// Fresh gives the asker of a Reserve on fresh slots of a class with
// restore on the data its identity left in the archive: the archives of its
// identity's newest allocation take the slots' places (into, a
// rename), in slot order. The asker is identified from a complete read of
// the node's allocations that began after the call arrived (*read, read
// here when nil), as the sole live holder of every slot. Whatever cannot be
// done is, with restore = "required", a wait; with "best-effort", a note,
// and the slot is reserved empty.
func (r *Restorer) Fresh(ctx context.Context, nomad allocs.Nomad, c reconcile.Class, ids []string, arrived time.Time, read **allocs.View) Outcome {
	out := Outcome{Notes: map[string]string{}}
	fail := func(why string, renew bool) Outcome {
		if c.Restore == reconcile.RestoreRequired {
			return Outcome{Wait: fmt.Sprintf("device %s: class %q has restore = %q and %s", strings.Join(ids, ", "), c.Name, reconcile.RestoreRequired, why), Renew: renew}
		}
		for _, id := range ids {
			out.Notes[id] = "started empty: " + why
		}
		out.Fresh = ids
		r.log.Warn("restore skipped; the slots start empty (restore = best-effort)", "devices", ids, "reason", why)
		return out
	}
	r.mu.Lock()
	archives := r.archives
	r.mu.Unlock()
	if archives == nil {
		out.Fresh = ids
		return out
	}
	if nomad == nil {
		return fail("the asker cannot be identified: this plugin cannot read allocations", true)
	}
	if *read == nil {
		v, err := nomad.View(ctx, arrived)
		if err != nil {
			return fail(fmt.Sprintf("the asker cannot be identified: the node's allocations cannot be read (%v)", err), true)
		}
		*read = v
		r.slots.SetIncomplete(v.Incomplete)
	}
	if !(*read).Complete {
		return fail("the asker cannot be identified: the token may not see every namespace (see the warning)", true)
	}
	var asker record.Owner
	for _, id := range ids {
		h := (*read).Holders(id)
		if len(h) != 1 || (asker.Known() && h[0].Owner != asker) {
			return fail(fmt.Sprintf("the asker cannot be identified: %d live allocations hold %s", len(h), id), true)
		}
		asker = h[0].Owner
	}
	switch {
	case asker.Truncated():
		// Its recorded identity could be another's.
		return fail(fmt.Sprintf("the names of %s are too long (%d bytes or more) to tell its data from another's", asker, record.MaxOwnerField), false)
	case asker.AllocIndex() < 0:
		// Its identity cannot be known, so neither can its data.
		return fail(fmt.Sprintf("the index of %s in its group cannot be read from its name %q", asker, asker.AllocName), false)
	}
	// Its predecessor's data may not be in the archive yet: still in
	// another slot, in use or on its way out. Wait for it to arrive
	// there rather than start without it.
	if other, leaving := predecessorSlot(r.slots.All(), c.Name, ids, asker, *read); other != "" {
		why := fmt.Sprintf("the data of its predecessor is still in device %s, not yet archived", other)
		if leaving && time.Since(arrived) < restoreSlotWait {
			// On its way, or its allocation has ended and the next pass
			// sends it (kicked now): with either setting, a wait of a
			// few hundred milliseconds, not a task started empty.
			r.slots.Kick()
			return Outcome{Wait: fmt.Sprintf("device %s: %s; it is on its way there", strings.Join(ids, ", "), why)}
		}
		return fail(why, true)
	}
	// Nor may its predecessor's data have reached backup_dir, from the
	// node it ran on: wait for that too.
	// best-effort waits for it restoreSlotWait, then restores the newest
	// there is, older, rather than hold the task to reserve_timeout.
	patient := c.Restore == reconcile.RestoreRequired || time.Since(arrived) < restoreSlotWait
	after, err := awaited(ctx, nomad, *read, c.Name, asker)
	if err != nil {
		why := fmt.Sprintf("whose data it must start with cannot be known: %v", err)
		if patient {
			return Outcome{Wait: fmt.Sprintf("device %s: class %q: %s", strings.Join(ids, ", "), c.Name, why), Renew: true}
		}
		r.log.Warn("whose data the slots must start with cannot be known; restoring the newest there is (restore = best-effort)", "devices", ids, "error", err)
	}
	names, from, release, err := archives.Claim(ctx, c.Name, asker, after)
	if errors.Is(err, record.ErrNotArrived) && !patient {
		release()
		r.log.Warn("the data of the asker's predecessor has not reached backup_dir; restoring the newest there is, which is older (restore = best-effort)",
			"devices", ids, "owner", asker.String(), "predecessor", after.Alloc, "predecessor_node", after.Node, "error", err)
		names, from, release, err = archives.Claim(ctx, c.Name, asker, record.Awaited{})
	}
	defer release()
	if errors.Is(err, record.ErrNotArrived) {
		// Its release on its node sends it within seconds: a wait, then
		// a new read (the predecessor may since be lost).
		return Outcome{Wait: fmt.Sprintf("device %s: class %q: the data of %s's predecessor is not in backup_dir yet, and its task waits for it (%v)",
			strings.Join(ids, ", "), c.Name, asker, err), Renew: true}
	}
	if errors.Is(err, record.ErrDiverged) {
		// The identity's data forked, or the operator's choice between
		// its forks leaves nothing to restore: a wait whatever the
		// class's restore setting. An empty start would begin a third
		// line of data, newer than both forks, which hides the fork
		// from every later restore and from backup_dir's retention.
		return Outcome{Wait: fmt.Sprintf("device %s: class %q: the data of %s cannot be restored, and its task does not start without it (%v)",
			strings.Join(ids, ", "), c.Name, asker, err), Renew: true}
	}
	if err != nil {
		return fail(fmt.Sprintf("the data of %s cannot be restored (%v)", asker, err), true)
	}
	if len(names) == 0 {
		out.Fresh = ids
		return out
	}
	for i, id := range ids {
		if i >= len(names) {
			out.Fresh = append(out.Fresh, id)
			continue
		}
		got, err := r.into(ctx, id, names[i], asker, from)
		if errors.Is(err, view.ErrChanged) && (c.Restore == reconcile.RestoreRequired || time.Since(arrived) < restoreSlotWait) {
			// Not a failure of the restore: the slot changed, or its
			// other name is still on its way to the archive (a release
			// of another tenant's dataset that put its spare in service
			// at once). The next round decides from the slot as it is
			// then; the archive waits for it rather than the asker start
			// without its data, under best-effort for restoreSlotWait.
			return Outcome{Wait: fmt.Sprintf("%v; its archive %s waits for it", err, names[i])}
		}
		if err != nil {
			why := fmt.Sprintf("restoring %s failed: %v", names[i], err)
			if c.Restore == reconcile.RestoreRequired {
				return Outcome{Wait: fmt.Sprintf("device %s: class %q has restore = %q and %s", id, c.Name, reconcile.RestoreRequired, why), Renew: true}
			}
			// A slot the asker now holds (the rename went through) is
			// handed to it by the next round, data and all.
			if s, ok := r.slots.Slot(id); ok && s.State == record.StateReserved {
				return Outcome{Wait: fmt.Sprintf("device %s: %s; the data is in the slot, reserved for %s", id, why, asker), Renew: true}
			}
			out.Notes[id] = "started empty: " + why
			out.Fresh = append(out.Fresh, id)
			r.log.Warn("restore failed; the slot starts empty (restore = best-effort)", "device", id, "archive", names[i], "error", err)
			continue
		}
		out.Restored = append(out.Restored, got)
	}
	return out
}

// into makes archive (of asker's identity, held against pruning)
// serve free slot id, reserved for asker, under the slot's lock: renamed to
// the slot's other name, then marked reserved and owned by asker, its
// data's lineage from recorded, allowed to mount, given the class quota,
// and mounted with the class's flags. The
// fresh dataset that served becomes the slot's spare. On return the slot
// is the asker's with the archive's data, or, on an error before the marks
// were written, unchanged with the archive back in place. It returns
// view.ErrChanged, having done nothing, when the slot is no longer free or its
// other name is still on its way to the archive: the caller decides again.
func (r *Restorer) into(ctx context.Context, id, archive string, asker record.Owner, from record.Lineage) (view.Slot, error) {
	unlock, err := r.slots.Lock(ctx, id, "restore")
	if err != nil {
		return view.Slot{}, err
	}
	defer unlock()
	cur, ok := r.slots.Slot(id)
	if !ok || cur.State != record.StateFree || !cur.OK || cur.Mountpoint == "" {
		return view.Slot{}, fmt.Errorf("device %s changed while its archive was being found: %w", id, view.ErrChanged)
	}
	if cur.Old != nil || cur.Sib == reconcile.NameReleasing {
		return view.Slot{}, fmt.Errorf("device %s: the slot's other dataset name is still being released: %w", id, view.ErrChanged)
	}
	if cur.Spare != "" || cur.Sib != reconcile.NameAbsent {
		return view.Slot{}, fmt.Errorf("device %s: the slot's other dataset name is taken (%s), and the archive needs it", id, view.OrDash(cur.Spare))
	}
	cfg := r.slots.Config()
	c := reconcile.ClassByName(cfg, cur.Class)
	names := cfg.SlotNames(cur.Class, cur.Index)
	target := names[0]
	if cur.Dataset == names[0] {
		target = names[1]
	}
	if err := r.zfs.Rename(ctx, archive, target); err != nil {
		return view.Slot{}, fmt.Errorf("renaming %s to %s: %w", archive, target, err)
	}
	marks := map[string]string{
		record.PropState: string(record.To(record.Restore)), record.PropOwner: asker.Encode(),
		"canmount": "on", "refquota": strconv.FormatUint(c.Quota, 10),
		// What the new tenant writes is backed up anew at its release.
		record.PropBackup: record.BackupNone,
	}
	if len(from) > 0 {
		// Where its data came from: a divergence of the identity's
		// data can then be told (record.Diverged).
		marks[record.PropDataFrom] = from.Encode()
	}
	if err := r.zfs.SetMany(ctx, target, marks); err != nil {
		// Some marks may have been written (one property at a time, or a
		// kernel that applies what it can): back where it was, an archive
		// again. Should that fail too, the dataset under the slot's name
		// says "reserved" or "archived": kept either way, never given to
		// another (its owner, if written, is the asker).
		rctx := context.WithoutCancel(ctx)
		if rerr := r.zfs.Rename(rctx, target, archive); rerr != nil {
			r.log.Error("a restored dataset could not be marked nor renamed back", "dataset", target, "error", rerr)
		} else if rerr := r.zfs.SetMany(rctx, archive, map[string]string{record.PropState: string(record.To(record.RestoreUndone)), "canmount": "noauto"}); rerr != nil {
			r.log.Error("a restored dataset renamed back could not be marked archived again", "dataset", archive, "error", rerr)
		}
		return view.Slot{}, fmt.Errorf("marking %s reserved for %s: %w", target, asker, err)
	}
	r.slots.Update(id, func(x *view.Slot) {
		x.Spare, x.SpareMount, x.SpareOwn, x.SpareArmed, x.Armed = x.Dataset, x.Mountpoint, x.OwnMount, x.Armed, ""
		// Not known without a read: an archive's mountpoint of its own
		// (set by hand) would follow it; the next read says.
		x.Dataset, x.Mountpoint, x.OwnMount = target, "", true
		x.State, x.Owner, x.Stamped = record.StateReserved, asker, asker
		x.Sib, x.Exists = reconcile.NameFresh, true
		x.Usage = zfs.Usage{}
		x.SetHealth(true, "")
	})
	s, _ := r.slots.Slot(id)
	got, err := r.slots.MountLocked(ctx, s)
	if err != nil {
		return view.Slot{}, fmt.Errorf("mounting %s: %w", target, err)
	}
	// The archive's name says when its data was left: at its release, or
	// for a live backup received from another node, when it was taken.
	if _, _, at, ok := record.ParseArchiveLeaf(archive[strings.LastIndexByte(archive, '/')+1:]); ok {
		got.RestoredAt = at
	}
	r.log.Info("slot reserved", "device", id, "dataset", target, "owner", asker.String(), "how", "restored", "archive", archive,
		"data_from", got.RestoredAt, "data_age", time.Since(got.RestoredAt).Truncate(time.Second))
	return got, nil
}

// restoreSlotWait is how long, from its arrival, a Reserve of a class with
// restore = "best-effort" waits for a release under way before its task
// starts empty: its predecessor's dataset on its way to the archive, or
// another tenant's still taking its slot's other name (a release that goes
// well takes a few hundred milliseconds; one that keeps failing, busy or
// out of room, would otherwise hold the asker to reserve_timeout).
// "required" waits until reserve_timeout.
const restoreSlotWait = 10 * time.Second

// On reports whether class c restores archives at Reserve.
func On(c reconcile.Class) bool {
	return c.Restore == reconcile.RestoreBestEffort || c.Restore == reconcile.RestoreRequired
}

// predecessorSlot returns a slot of class (among all) whose dataset
// belongs to an allocation of asker's identity other than asker: the one
// serving (in slots other than ids, which the asker is reserving), or the
// old one on its way to the archive (in any slot); "" for none. leaving
// says that every such dataset is on its way to the archive, or soon will
// be: being released, or recorded in use by an allocation that v (the read
// made for this Reserve) shows ended, stopping or gone from the node's
// list, whose release the next pass starts. That is weak evidence on
// purpose: it only ever makes the asker wait (restoreSlotWait), never
// hands anything over.
func predecessorSlot(all []view.Slot, class string, ids []string, asker record.Owner, v *allocs.View) (id string, leaving bool) {
	mine := map[string]bool{}
	for _, id := range ids {
		mine[id] = true
	}
	leaving = true
	for _, s := range all {
		if s.Class != class {
			continue
		}
		held := s.State == record.StateReserved || s.State == record.StateReleasing || s.State == record.StateDestroying
		if !mine[s.ID] && held && s.Owner.AllocID != asker.AllocID && record.SameIdentity(s.Owner, asker) {
			if id == "" {
				id = s.ID
			}
			leaving = leaving && (s.State != record.StateReserved || endedIn(v, s.Owner))
		}
		if s.Old != nil && s.Old.Owner.AllocID != asker.AllocID && record.SameIdentity(s.Old.Owner, asker) && id == "" {
			id = s.ID
		}
	}
	if id == "" {
		return "", false
	}
	return id, leaving
}

// endedIn reports whether read v shows o's allocation ended for its task,
// told to stop, or not in the node's list at all.
func endedIn(v *allocs.View, o record.Owner) bool {
	a, ok := v.Allocs[o.AllocID]
	return !ok || a.Stopping || a.Ended(o.Task)
}
