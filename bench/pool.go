package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/sandbox"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// NewPool creates a pool for one size with the sandbox the tests' helper
// wraps, on a sparse file in a new directory under /var/tmp. The returned
// destroy destroys the pool and then removes its directory, the mount point
// only when it is empty, never recursively. On error nothing is left.
func NewPool(ctx context.Context, size int64) (p *sandbox.Pool, destroy func() error, err error) {
	dir, err := os.MkdirTemp("/var/tmp", "zfsbench-")
	if err != nil {
		return nil, nil, err
	}
	if p, err = sandbox.CreatePool(ctx, dir, "zbench", size); err != nil {
		_ = os.Remove(dir)
		return nil, nil, err
	}
	return p, func() error {
		if err := p.Destroy(); err != nil {
			return fmt.Errorf("%w (pool file left in %s)", err, dir)
		}
		_ = os.Remove(filepath.Join(dir, "pool.img"))
		_ = os.Remove(p.Mountpoint) // empty once the pool is gone
		return os.Remove(dir)
	}, nil
}

// NewParent is NewPool with the plugin's parent dataset, <pool>/nomad,
// made in it: what the benches that run the plugin in an agent start
// from. On error nothing is left.
func NewParent(ctx context.Context, size int64) (p *sandbox.Pool, parent string, destroy func() error, err error) {
	if p, destroy, err = NewPool(ctx, size); err != nil {
		return nil, "", nil, err
	}
	parent = p.Dataset("nomad")
	if _, err := (&zfs.Runner{}).ZFSCmd(ctx, "create", parent); err != nil {
		return nil, "", nil, errors.Join(err, destroy())
	}
	return p, parent, destroy, nil
}
