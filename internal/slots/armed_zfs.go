package slots

import (
	"context"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/armed"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// armedZFS is the manager's ZFS: reads normalized (armed.Tracker.Normalize),
// and fresh slot datasets created armed (armed.Tracker.Arm).
type armedZFS struct {
	ZFS
	a *armed.Tracker
}

func (z armedZFS) Get(ctx context.Context, name string, depth int, props ...string) ([]zfs.Dataset, error) {
	began := time.Now()
	ds, err := z.ZFS.Get(ctx, name, depth, props...)
	return z.a.Normalize(ds, began, name, depth, err == nil), err
}

func (z armedZFS) GetNames(ctx context.Context, names []string, props ...string) ([]zfs.Dataset, error) {
	began := time.Now()
	ds, err := z.ZFS.GetNames(ctx, names, props...)
	return z.a.Normalize(ds, began, "", 0, false), err
}

// Create makes a slot dataset that would be created free armed instead.
func (z armedZFS) Create(ctx context.Context, name string, props map[string]string) error {
	return z.ZFS.Create(ctx, name, z.a.Arm(name, props))
}
