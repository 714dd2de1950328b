package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Tenants stands in for the Nomad allocation API (slots.Nomad) when the
// benchmark drives releases: it decides which allocation holds a device and
// when that allocation ends. What is measured is the ZFS work of a release,
// not the Nomad API (the end-to-end tests use a real agent for that).
type Tenants struct {
	mu      sync.Mutex
	holders map[string]record.Owner // live holder, by device ID
	ended   map[string]record.Owner // by allocation ID
	placed  map[string]bool         // allocation IDs placed whose task has not started
	seq     int
}

// NewTenants returns a Tenants with no allocation.
func NewTenants() *Tenants {
	return &Tenants{holders: map[string]record.Owner{}, ended: map[string]record.Owner{}, placed: map[string]bool{}}
}

// View implements slots.Nomad: every live holder is running with its task
// started (unless placed by Next and not started yet), every ended allocation is complete, and the view sees every
// namespace. It is read now, so it always began after since.
func (t *Tenants) View(_ context.Context, _ time.Time) (*slots.View, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := &slots.View{Began: time.Now(), Allocs: map[string]slots.Alloc{}, Complete: true}
	for id, o := range t.holders {
		v.Allocs[o.AllocID] = slots.Alloc{
			Owner: untasked(o), ClientStatus: "running",
			Devices: map[string]string{id: o.Task}, Started: map[string]bool{o.Task: !t.placed[o.AllocID]}, Dead: map[string]bool{},
		}
	}
	for _, o := range t.ended {
		v.Allocs[o.AllocID] = slots.Alloc{
			Owner: untasked(o), ClientStatus: "complete",
			Devices: map[string]string{}, Started: map[string]bool{o.Task: true}, Dead: map[string]bool{o.Task: true},
		}
	}
	return v, nil
}

// untasked is o as a view lists it: an allocation, not one of its tasks.
func untasked(o record.Owner) record.Owner {
	o.Task = ""
	return o
}

// Incomplete implements slots.Nomad: the tenants see every namespace.
func (t *Tenants) Incomplete(context.Context) string { return "" }

// Latest implements slots.Nomad: every read is of now.
func (t *Tenants) Latest(ctx context.Context) (*slots.View, error) { return t.View(ctx, time.Time{}) }

// Holds implements slots.Nomad: o holds ids when it is their holder.
func (t *Tenants) Holds(_ context.Context, o record.Owner, ids []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if t.holders[id] != o {
			return fmt.Errorf("%s does not hold %s", o, id)
		}
	}
	return nil
}

// Prior implements slots.Nomad: the tenants replace none (their views
// name no previous allocation), so it is never asked.
func (t *Tenants) Prior(_ context.Context, _, allocID string) (slots.Prior, error) {
	return slots.Prior{}, fmt.Errorf("allocation %s: the bench's tenants replace no allocation", allocID)
}

// Gone implements slots.Nomad: an allocation is gone once End was called
// for it (the view lists it as complete anyway).
func (t *Tenants) Gone(_ context.Context, o record.Owner) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.ended[o.AllocID]
	return ok, nil
}

// Hold makes a new allocation the holder of device id and returns it.
func (t *Tenants) Hold(id string) record.Owner {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	o := record.Owner{
		AllocID:   fmt.Sprintf("%08x-0000-4000-8000-000000000000", t.seq),
		Namespace: "default", Job: "bench", Group: "group", Task: "task",
		AllocName: fmt.Sprintf("bench.group[%d]", t.seq),
	}
	t.holders[id] = o
	return o
}

// HoldAs makes a new allocation of bench.group[index] (the same identity
// for the same index: a replacement) the holder of device id, and returns it.
func (t *Tenants) HoldAs(id string, index int) record.Owner {
	o := t.Hold(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	o.AllocName = fmt.Sprintf("bench.group[%d]", index)
	t.holders[id] = o
	return o
}

// Next places a new allocation on device id whose task has not started,
// as Nomad places the next tenant of a device whose holder has ended, and
// returns it. Its Reserve gets the slot.
func (t *Tenants) Next(id string) record.Owner {
	o := t.Hold(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.placed[o.AllocID] = true
	return o
}

// End ends allocation o.
func (t *Tenants) End(o record.Owner) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended[o.AllocID] = o
	for id, h := range t.holders {
		if h == o {
			delete(t.holders, id)
		}
	}
}

// Tenancy puts a tenant on device id of mgr, as a job would: a new
// allocation holds it, Reserve marks it, the owner is stamped, and a file is
// written into the dataset. It returns the tenant; ending it (t.End) and
// calling mgr.ReleaseEnded is the release that the benchmark measures.
func Tenancy(ctx context.Context, mgr *slots.Manager, t *Tenants, id string) (record.Owner, error) {
	o := t.Hold(id)
	res, err := mgr.Reserve(ctx, []string{id})
	if err != nil {
		return o, err
	}
	// The slot's spare, made in the background, first: while it holds
	// the slot, a pass leaves the owner pending (recordOwner waits 100 ms
	// for the slot), and the stamp would land in what the caller counts.
	if err := mgr.Wait(ctx); err != nil {
		return o, err
	}
	if err := mgr.ReleaseEnded(ctx); err != nil { // stamps the owner
		return o, err
	}
	// Then the spare, made once the owner is recorded (slots/armed.go).
	if err := mgr.Wait(ctx); err != nil {
		return o, err
	}
	return o, os.WriteFile(filepath.Join(res[0].Mountpoint, "data"), []byte(o.AllocID), 0o644)
}

// CheckFresh reports an error unless device id of mgr is free, healthy,
// mounted and empty: the state a release must leave it in.
func CheckFresh(mgr *slots.Manager, id string) error {
	for _, s := range mgr.Slots() {
		if s.ID != id {
			continue
		}
		if !s.Healthy || s.State != record.StateFree || s.Mountpoint == "" {
			return fmt.Errorf("%s after release: state %s, healthy %t (%s), mountpoint %q", id, s.State, s.Healthy, s.HealthDesc, s.Mountpoint)
		}
		entries, err := os.ReadDir(s.Mountpoint)
		if err != nil {
			return err
		}
		if len(entries) > 0 {
			return fmt.Errorf("%s after release: %s is not empty", id, s.Mountpoint)
		}
		return nil
	}
	return fmt.Errorf("%s: no such slot after release", id)
}

// TimedRelease ends the tenant of device id and runs one release pass, as
// the plugin's release worker does when the allocation list says the
// allocation is over. It returns how long the pass took, once it has checked
// that the slot came back fresh.
func TimedRelease(ctx context.Context, mgr *slots.Manager, t *Tenants, id string, o record.Owner) (time.Duration, error) {
	t.End(o)
	start := time.Now()
	err := mgr.ReleaseEnded(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	return d, CheckFresh(mgr, id)
}
