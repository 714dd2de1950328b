package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

// Tenants stands in for the Nomad allocation API (slots.Nomad) when the
// benchmark drives releases: it decides which allocation holds a device and
// when that allocation ends. What is measured is the ZFS work of a release,
// not the Nomad API (the end-to-end tests use a real agent for that).
type Tenants struct {
	mu      sync.Mutex
	holders map[string]slots.Owner // live holder, by device ID
	ended   map[string]bool        // by allocation ID
	seq     int
}

// NewTenants returns a Tenants with no allocation.
func NewTenants() *Tenants {
	return &Tenants{holders: map[string]slots.Owner{}, ended: map[string]bool{}}
}

// Holders implements slots.Nomad.
func (t *Tenants) Holders(id string) []slots.Owner {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.holders[id]; ok {
		return []slots.Owner{o}
	}
	return nil
}

// Fate implements slots.Nomad: an allocation has ended once End was called
// for it.
func (t *Tenants) Fate(_ context.Context, o slots.Owner) (slots.Fate, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slots.Fate{Ended: t.ended[o.AllocID], Reason: "allocation is complete"}, nil
}

// Hold makes a new allocation the holder of device id and returns it.
func (t *Tenants) Hold(id string) slots.Owner {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	o := slots.Owner{
		AllocID:   fmt.Sprintf("%08x-0000-4000-8000-000000000000", t.seq),
		Namespace: "default", Job: "bench", Group: "group", Task: "task",
		AllocName: fmt.Sprintf("bench.group[%d]", t.seq),
	}
	t.holders[id] = o
	return o
}

// End ends allocation o.
func (t *Tenants) End(o slots.Owner) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended[o.AllocID] = true
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
func Tenancy(ctx context.Context, mgr *slots.Manager, t *Tenants, id string) (slots.Owner, error) {
	o := t.Hold(id)
	res, err := mgr.Reserve(ctx, []string{id})
	if err != nil {
		return o, err
	}
	if err := mgr.ReleaseEnded(ctx); err != nil { // stamps the owner
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
		if !s.Healthy || s.State != slots.StateFree || s.Mountpoint == "" {
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
func TimedRelease(ctx context.Context, mgr *slots.Manager, t *Tenants, id string, o slots.Owner) (time.Duration, error) {
	t.End(o)
	start := time.Now()
	err := mgr.ReleaseEnded(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	return d, CheckFresh(mgr, id)
}
