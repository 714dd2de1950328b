package device

import (
	"context"
	"errors"
	"fmt"

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
