package bench

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfstest"
)

// newPool creates a pool for one size with the tests' helper, on a sparse
// file in a new directory under /var/tmp. The returned destroy destroys the
// pool and then removes its directory, the mount point only when it is
// empty, never recursively.
func newPool(size int64) (p *zfstest.Pool, destroy func() error, err error) {
	dir, err := os.MkdirTemp("/var/tmp", "zfsbench-")
	if err != nil {
		return nil, nil, err
	}
	if p, err = zfstest.CreatePool(dir, "zbench", size); err != nil {
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
