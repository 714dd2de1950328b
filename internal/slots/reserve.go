package slots

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/decide"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/preps"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Reserve is called (through the device plugin) when Nomad starts a task
// that was given these device IDs; it returns the slots in the order of
// their index, whatever order Nomad gave (it comes from a map, so it
// differs between allocations): the task finds the same data at the same
// path after a restore, which gives the archives in the order of the slots
// they came from. All IDs must belong to one class.
//
// A slot is handed over only when that is provably safe:
//   - a fresh slot (free, healthy, mounted: no tenant has written to it)
//     costs no zfs command when this run armed it (package armed), one zfs set
//     otherwise. An allocation read that began after the call
//     arrived, made at the same time, records who asked.
//   - a slot a tenant may have written goes only to its recorded owner,
//     shown as the sole live holder of the device by a read of the node's
//     allocations that began after this call arrived (a repeated Reserve).
//     When the recorded owner has positively ended and the only other
//     holder has not started (the asker), the slot is released first and
//     the asker gets the fresh dataset that replaces it.
//
// Anything else — an owner that is unknown, not ended or not visible, the
// API unreachable, two live holders — keeps the data: Reserve waits until
// ctx is done and then fails with an error that names the slot and why.
// No lock is held while Reserve waits or reads the API.
func (m *Manager) Reserve(ctx context.Context, ids []string) ([]Slot, error) {
	arrived := time.Now()
	// The asker's task is starting: from now on, before this Reserve
	// starts any background run (a release behind a handover, a spare),
	// and again once it is answered.
	m.starts.Begin()
	ids = m.inSlotOrder(ids)
	ps, prepared, release := m.claimPreps(ids)
	defer release()
	if !prepared {
		m.noteAsked(arrived)
	}
	waited := false
	res, err := m.reserve(ctx, ids, arrived, &waited, ps, prepared)
	if err == nil {
		m.starts.Begin()
	}
	if o := m.observer(); o != nil {
		outcome := ReserveFresh
		switch {
		case err != nil:
			outcome = ReserveFailed
		case waited:
			outcome = ReserveWaited
		}
		o.ReserveDone(outcome, time.Since(arrived))
	}
	return res, err
}

// noteAsked records that a Reserve arrived at arrived, before it may hand
// over a dataset whose asker a release pass has not seen: see m.asked. A
// Reserve of prepared slots notes it only when it cannot use them (their
// asker is in the view they were prepared from).
func (m *Manager) noteAsked(arrived time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if arrived.After(m.asked) {
		m.asked = arrived
	}
}

// reserve is Reserve; it sets *waited when it had to wait. ps are the
// preparations of ids, all of them when prepared is set (claimPreps).
func (m *Manager) reserve(ctx context.Context, ids []string, arrived time.Time, waited *bool, ps []*preps.Prep, prepared bool) ([]Slot, error) {
	if len(ids) == 0 {
		return nil, errors.New("no device IDs to reserve")
	}
	if err := m.checkIDs(ids); err != nil {
		return nil, err
	}
	// A slot handed over before the proof of its asker (proof.go) is
	// decided once that proof has answered.
	if err := m.awaitProofs(ctx, ids); err != nil {
		return nil, fmt.Errorf("device %s: %w", strings.Join(ids, ", "), err)
	}
	if prepared {
		m.mu.Lock()
		nomad := m.nomad
		m.mu.Unlock()
		res, ok, why := m.reservePrepared(ctx, nomad, ids, ps, arrived)
		if ok {
			return res, nil
		}
		m.log.Debug("prepared slots not handed over at once; the usual proof decides", "devices", ids, "reason", why)
		m.noteAsked(arrived)
	}
	// The usual rounds decide from the slots as their preparations left
	// them: a preparation still under way (of some of ids) ends first.
	for _, p := range ps {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
		case <-ctx.Done():
			return nil, fmt.Errorf("device %s: waiting for its preparation: %w", strings.Join(ids, ", "), ctx.Err())
		}
	}
	var view *View // the latest read that began after arrived
	var why string // the latest round's reason to wait
	for {
		changed := m.Changed()
		res, wait, err := m.tryReserve(ctx, ids, arrived, &view)
		if err != nil || wait == "" {
			return res, err
		}
		if ctx.Err() != nil && why != "" {
			// reserve_timeout cut this round short: the reason to tell
			// is the one the round before found (a full pool, say), not
			// the deadline.
			wait = why
		}
		why = wait
		*waited = true
		m.log.Debug("reserve waiting", "devices", ids, "reason", wait)
		m.Kick()
		retry := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil, fmt.Errorf("%s; gave up after %s (reserve_timeout)", wait, time.Since(arrived).Round(time.Second))
		case <-changed:
		case <-retry.C:
		}
		retry.Stop()
	}
}

// inSlotOrder returns a copy of ids sorted by the index of their slot;
// unknown IDs (which checkIDs refuses) go last, in the order given.
func (m *Manager) inSlotOrder(ids []string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	index := func(id string) int {
		if i, ok := m.byID[id]; ok {
			return m.slots[i].Index
		}
		return math.MaxInt
	}
	out := slices.Clone(ids)
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(index(a), index(b)) })
	return out
}

// checkIDs verifies that every ID names a slot and that all are of one class.
func (m *Manager) checkIDs(ids []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var class, first string
	for _, id := range ids {
		i, ok := m.byID[id]
		if !ok {
			return fmt.Errorf("unknown device ID %q: this node offers %s", id, m.idSummaryLocked())
		}
		if s := m.slots[i]; first == "" {
			class, first = s.Class, id
		} else if s.Class != class {
			return fmt.Errorf("device IDs %q and %q belong to different classes (%s, %s): reserve one class at a time", first, id, class, s.Class)
		}
	}
	return nil
}

// decidedRelease is a release that Reserve starts: the slot, and the
// allocation asking for it.
type decidedRelease struct {
	slot  Slot
	asker record.Owner
}

// tryReserve reserves the slots if that is safe now. Otherwise it starts
// what it can (the release of a slot whose owner has ended) and returns why
// the caller must wait. *view caches the allocation read of this round.
func (m *Manager) tryReserve(ctx context.Context, ids []string, arrived time.Time, view **View) (res []Slot, wait string, err error) {
	m.mu.Lock()
	nomad := m.nomad
	m.mu.Unlock()
	var fresh []string
	var spares []Slot // held slots: their spare goes to the asker as a fresh slot does
	var release []decidedRelease
	// renew: the wait is for something outside this plugin, so the next
	// round needs a new read. A wait for releases only keeps the read: it
	// began after the call arrived, which is all its proofs need.
	renew := false
	defer func() {
		if renew {
			*view = nil
		}
	}()
	for _, id := range ids {
		s, ok := m.slot(id)
		if !ok {
			return nil, "", fmt.Errorf("device %s is no longer offered by this node", id)
		}
		if s.State == record.StateFree {
			if !s.OK || s.Mountpoint == "" {
				return nil, "", fmt.Errorf("device %s (dataset %s) cannot be reserved: %s", s.ID, s.Dataset, s.Why)
			}
			fresh = append(fresh, id)
			continue
		}
		if s.State == record.StateReleasing || s.State == record.StateDestroying {
			wait = fmt.Sprintf("device %s is being released from %s", s.ID, s.Owner)
			continue
		}
		if s.State != record.StateReserved || s.Unreadable {
			return nil, "", fmt.Errorf("device %s (dataset %s) cannot be reserved: %s", s.ID, s.Dataset, s.Why)
		}
		if m.heldForNext(s) {
			// A release pass found its owner ended ("ended" never goes
			// back) and left the slot, its spare ready, to its next
			// tenant (spareHold): the spare is handed over as a fresh
			// slot is.
			spares = append(spares, s)
			continue
		}
		// A slot a tenant may have written: proof first.
		if nomad == nil {
			wait, renew = fmt.Sprintf("device %s holds the data of %s and this plugin cannot read allocations to verify the asker", s.ID, s.Owner), true
			continue
		}
		if *view == nil {
			v, err := nomad.View(ctx, arrived)
			if err != nil {
				wait = fmt.Sprintf("device %s holds the data of %s, and the node's allocations cannot be read to verify the asker (%v)", s.ID, s.Owner, err)
				continue
			}
			*view = v
			m.setIncomplete(v.Incomplete)
		}
		switch d := decide.Decide(ctx, m.log, m.arm, nomad, *view, s, true); d.Kind {
		case decide.Adopt:
			adopted, why, err := m.adoptArmed(ctx, s)
			switch {
			case err != nil:
				wait, renew = fmt.Sprintf("device %s: %v", s.ID, err), true
			case !adopted:
				wait, renew = fmt.Sprintf("device %s (dataset %s) was armed by an earlier run of the plugin and is not known to be fresh (%s); its data is kept until no allocation holds it", s.ID, s.Dataset, why), true
			default:
				fresh = append(fresh, id)
			}
		case decide.HandOver:
			back, err := m.mountForOwner(zfs.Foreground(ctx), s)
			if err != nil {
				return nil, "", fmt.Errorf("device %s (dataset %s) cannot go back to its owner %s: %w", s.ID, s.Dataset, s.Owner, err)
			}
			m.log.Info("slot reserved", "device", s.ID, "dataset", s.Dataset, "owner", s.Owner.String(), "how", "owner", "took", time.Since(arrived))
			res = append(res, back)
		case decide.StartRelease:
			if c := m.classOf([]string{id}); restores(c) {
				if d.Asker.Known() && record.SameIdentity(d.Asker, s.Owner) {
					// The replacement of an ended allocation: it keeps
					// the dataset, data and all.
					got, err := m.restorer.InPlace(ctx, s, d.Asker)
					if err == nil {
						res = append(res, got)
						continue
					}
					wait, renew = fmt.Sprintf("device %s: handing the data of %s to its replacement %s: %v", s.ID, s.Owner, d.Asker, err), !errors.Is(err, errChanged)
					continue
				}
				// Another identity: the dataset is archived, and the
				// asker gets the fresh slot, with its own archive if any.
				d.Asker = record.Owner{}
			}
			if d.Asker.Known() {
				var err error
				if s, err = m.adoptWithheld(ctx, *view, s, d, true); err != nil {
					wait, renew = fmt.Sprintf("device %s: %v", s.ID, err), true
					continue
				}
			}
			if d.Asker.Known() && s.Spare != "" && s.OK {
				// The asker gets the spare; the owner's dataset is
				// archived behind it.
				got, err := m.handOverSpare(ctx, s, d.Asker)
				if err == nil {
					m.log.Info("slot reserved", "device", s.ID, "dataset", got.Dataset, "owner", d.Asker.String(), "how", "spare", "took", time.Since(arrived))
					res = append(res, got)
					continue
				}
				wait = fmt.Sprintf("device %s is being released from %s (%s)", s.ID, s.Owner, d.Reason)
				if !errors.Is(err, errChanged) {
					wait, renew = fmt.Sprintf("%s; handing over its spare: %v", wait, err), true
				}
				continue
			}
			release = append(release, decidedRelease{s, d.Asker})
			wait = fmt.Sprintf("device %s is being released from %s (%s)", s.ID, s.Owner, d.Reason)
		case decide.InUse:
			wait, renew = fmt.Sprintf("device %s is in use by %s (%s), and the asker is not among the device's holders", s.ID, s.Owner, d.Reason), true
		default:
			wait, renew = fmt.Sprintf("device %s: %s", s.ID, d.Reason), true
		}
	}
	// Start the releases here rather than wait for the release loop (or
	// join the loop's run), and wait for them: the asker waits for them.
	var runs []*releaseRun
	for _, r := range release {
		run := m.goRelease(ctx, r.slot, true, r.asker)
		run.hurry() // the asker waits for it: no yielding to other starts
		runs = append(runs, run)
	}
	for _, r := range runs {
		select {
		case <-r.done:
			if r.err != nil {
				wait, renew = fmt.Sprintf("%s; release: %v", wait, r.err), true
			}
		case <-ctx.Done():
		}
	}
	if wait != "" {
		return nil, wait, nil
	}
	var notes map[string]string
	if c := m.classOf(fresh); c.Restore == RestoreBestEffort || c.Restore == RestoreRequired {
		o := m.restorer.Fresh(ctx, nomad, c, fresh, arrived, view)
		if o.Wait != "" {
			renew = o.Renew
			return nil, o.Wait, nil
		}
		res = append(res, o.Restored...)
		fresh, notes = o.Fresh, o.Notes
	}
	reserved, err := m.reserveFresh(ctx, nomad, fresh, spares, arrived, *view)
	if retry := (retryReserve{}); errors.As(err, &retry) {
		renew = !errors.Is(err, errChanged)
		return nil, retry.Error(), nil
	}
	if err != nil {
		return nil, "", err
	}
	for id, why := range notes {
		m.setEmptyStart(id, why)
	}
	// In the order of ids: the slots' (see Reserve).
	byID := map[string]Slot{}
	for _, s := range append(res, reserved...) {
		byID[s.ID] = s
	}
	out := make([]Slot, 0, len(ids))
	for _, id := range ids {
		out = append(out, byID[id])
	}
	return out, "", nil
}

// classOf returns the class of the first of ids (all of one class: see
// checkIDs), or a zero Class when there is none.
func (m *Manager) classOf(ids []string) Class {
	if len(ids) == 0 {
		return Class{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.byID[ids[0]]
	if !ok {
		return Class{}
	}
	return reconcile.ClassByName(m.cfg, m.slots[i].Class)
}

// retryReserve is an error of one round of Reserve that the next round may
// not meet (the slot changed, ZFS refused for now): Reserve waits and
// tries again, until its context is done.
type retryReserve struct{ err error }

func (r retryReserve) Error() string { return r.err.Error() }
func (r retryReserve) Unwrap() error { return r.err }
