package device

import (
	"context"
	"errors"
	"fmt"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// snapshotReader is what checkSources reads. *zfs.Client implements it.
type snapshotReader interface {
	SnapshotGUID(ctx context.Context, name string) (uint64, error)
}

// checkSources makes sure that every class's source snapshot exists now
// (one command per class with a source, at SetConfig only), so that a typo
// is a config error naming the field rather than slots that cannot be
// made. A source destroyed later makes the class's new slots fail to be
// made, unhealthy with the reason.
func checkSources(ctx context.Context, z snapshotReader, classes []slots.Class) error {
	for _, c := range classes {
		if c.Source == "" {
			continue
		}
		if _, err := z.SnapshotGUID(ctx, c.Source); err != nil {
			if errors.Is(err, zfs.ErrNotExist) {
				return fmt.Errorf("class %q: source = %q: no such snapshot (make it with zfs snapshot, or name one that `zfs list -t snapshot` shows)", c.Name, c.Source)
			}
			return fmt.Errorf("class %q: source = %q: %w", c.Name, c.Source, err)
		}
	}
	return nil
}

// checkEncryption refuses an encrypted class where the ZFS has no native
// encryption (zfs-fuse), and makes sure the key directory is the
// plugin's alone (see slots.EnsureKeyDir). It runs after the capability
// probe.
func (p *Plugin) checkEncryption(cfg slots.Config, encrypted bool) error {
	p.mu.Lock()
	caps := p.caps
	p.mu.Unlock()
	for _, c := range cfg.Classes {
		if c.Encrypted && !caps.Encryption {
			return fmt.Errorf("class %q: encryption = true: this ZFS (%s) has no native encryption; it needs OpenZFS 0.8 or later", c.Name, caps.Implementation)
		}
	}
	if !encrypted {
		return nil // key_dir is only read (keys of datasets made while a class was encrypted)
	}
	if err := record.EnsureKeyDir(cfg.KeyDir); err != nil {
		return fmt.Errorf("key_dir = %q: %w", cfg.KeyDir, err)
	}
	return nil
}
