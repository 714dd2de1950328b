package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Pool is a file-backed pool that the harness creates for one size and
// destroys afterwards. (Tests use zfstest.NewPool instead.)
type Pool struct {
	Name       string
	Dir        string // holds the backing file and the mount point
	Mountpoint string
}

// CreatePool creates a pool on a sparse file of size bytes in a new
// directory under /var/tmp.
func CreatePool(ctx context.Context, size int64) (*Pool, error) {
	dir, err := os.MkdirTemp("/var/tmp", "zfsbench-")
	if err != nil {
		return nil, err
	}
	img := filepath.Join(dir, "pool.img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		_ = f.Close()
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pool file: %w", err)
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	p := &Pool{Name: "zbench" + hex.EncodeToString(suffix[:]), Dir: dir, Mountpoint: filepath.Join(dir, "mnt")}
	if out, err := exec.CommandContext(ctx, "zpool", "create", "-m", p.Mountpoint, p.Name, img).CombinedOutput(); err != nil {
		_ = os.Remove(img)
		_ = os.Remove(dir)
		return nil, fmt.Errorf("zpool create %s: %v: %s", p.Name, err, strings.TrimSpace(string(out)))
	}
	return p, nil
}

// Dataset returns the name of a dataset in the pool.
func (p *Pool) Dataset(rel string) string { return p.Name + "/" + rel }

// Destroy destroys the pool, retrying while zfs-fuse reports it busy, and
// with -f as a last resort (the pool is the benchmark's own, nothing else
// lives on it), then removes its directory. The mount point directory is
// removed only when it is empty, never recursively.
func (p *Pool) Destroy() error {
	var out []byte
	var err error
	for i := 0; i < 30; i++ {
		if out, err = exec.Command("zpool", "destroy", p.Name).CombinedOutput(); err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		if out2, err2 := exec.Command("zpool", "destroy", "-f", p.Name).CombinedOutput(); err2 != nil {
			return fmt.Errorf("zpool destroy %s: %v: %s; then -f: %v: %s", p.Name, err, strings.TrimSpace(string(out)), err2, strings.TrimSpace(string(out2)))
		}
	}
	_ = os.Remove(filepath.Join(p.Dir, "pool.img"))
	_ = os.Remove(p.Mountpoint) // empty once the pool is gone
	return os.Remove(p.Dir)
}
