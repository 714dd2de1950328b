package device

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// RetentionPeriod is how often the archive is checked against the
// retention rules, besides after every release.
const RetentionPeriod = time.Minute

// slotEvents is told of the slot manager's Reserve calls and releases: it
// counts them, and has the archive backed up and pruned after each release.
type slotEvents struct {
	*metrics.Metrics
	pruner *retention.Pruner
	keeper *backup.Keeper
}

// ReleaseDone counts the release and, when it archived or destroyed a
// dataset, asks for a backup pass and a retention pass.
func (e slotEvents) ReleaseDone(class string, err error, took time.Duration) {
	e.Metrics.ReleaseDone(class, err, took)
	if err == nil {
		e.keeper.Kick()
		e.pruner.Kick()
	}
}

// archiveSource is where a restore finds an identity's data: the newest of
// the local archive and backup_dir, received into the local archive first
// when it is the backup.
type archiveSource struct {
	pruner *retention.Pruner
	keeper *backup.Keeper
}

// Claim returns the archives of o's identity, held against pruning, and
// the lineage their data has once restored: the local ones, unless
// backup_dir holds a newer backup of the identity (it was on another node
// since), which is then received and claimed. A backup_dir that cannot be
// read is an error, local archives or not: which is newest cannot be
// known. While neither holds the data of after (o's predecessor's from
// another node; zero for none), the error wraps record.ErrNotArrived.
func (a archiveSource) Claim(ctx context.Context, class string, o record.Owner, after record.Awaited) ([]string, record.Lineage, func(), error) {
	names, local, release, err := a.pruner.ClaimNewest(ctx, class, o)
	if err != nil {
		return nil, nil, release, err
	}
	got, err := a.keeper.FetchAfter(ctx, class, o, local, after)
	switch {
	case err != nil:
		release()
		return nil, nil, func() {}, fmt.Errorf("fetching from backup_dir: %w", err)
	case got == "":
		return names, lineageOf(names, local), release, nil
	}
	release()
	names, local, release, err = a.pruner.ClaimNewest(ctx, class, o)
	switch {
	case err == nil && len(names) == 0:
		release()
		return nil, nil, func() {}, fmt.Errorf("received %s from backup_dir, but the archive does not hold it for %s", got, o)
	case err == nil && !slices.Contains(names, got):
		release()
		return nil, nil, func() {}, fmt.Errorf("received %s from backup_dir, but the archive ranks %s newer for %s", got, local.Name, o)
	}
	return names, lineageOf(names, local), release, err
}

// lineageOf is the lineage of newest's data once restored; none when
// nothing was claimed.
func lineageOf(names []string, newest retention.Archive) record.Lineage {
	if len(names) == 0 {
		return nil
	}
	return newest.Lineage()
}
