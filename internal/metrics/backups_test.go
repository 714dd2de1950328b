package metrics_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/metrics"
)

// The backup gauges: nothing before the keeper has listed backup_dir;
// then per identity (labels class and identity) the newest backup's age,
// computed at the scrape from the time the listing holds, and the chain
// that restores it (0 for a broken one); and the totals.
func TestMetrics_BackupGauges(t *testing.T) {
	src := &fakeSource{}
	m := metrics.New(src)
	f := gather(t, m)
	for _, name := range []string{"backup_newest_age_seconds", "backup_chain_bytes", "backup_chain_streams",
		"backup_identities", "backup_dir_bytes", "backup_forked_identities", "backup_listing_age_seconds"} {
		_, ok := f.Value("nomad_device_zfs_"+name, nil)
		must.False(t, ok, must.Sprintf("%s before backup_dir was listed", name))
	}

	now := time.Now()
	db := metrics.BackupIdentity{Class: "state", Identity: "default/db/g[0]/t (state)", NewestAt: now.Add(-90 * time.Minute),
		ChainStreams: 3, ChainBytes: 5 << 20}
	broken := metrics.BackupIdentity{Class: "state", Identity: `web/"build\tnightly"/ci[2]/make (state)`, NewestAt: now.Add(-2 * time.Hour), Forked: true}
	src.mu.Lock()
	src.backups = metrics.Backups{Identities: []metrics.BackupIdentity{db, broken}, Bytes: 9 << 20, ListedAt: now.Add(-10 * time.Minute)}
	src.backupsKnown = true
	src.mu.Unlock()
	before := time.Now()
	f = gather(t, m)
	after := time.Now()

	// between checks an age gauge: the seconds from at to the scrape.
	between := func(name string, labels map[string]string, at time.Time) {
		t.Helper()
		v := value(t, f, name, labels)
		must.GreaterEq(t, before.Sub(at).Seconds(), v, must.Sprint(name, labels))
		must.LessEq(t, after.Sub(at).Seconds(), v, must.Sprint(name, labels))
	}
	for _, tc := range []struct {
		id             metrics.BackupIdentity
		streams, bytes float64
	}{
		{db, 3, 5 << 20},
		{broken, 0, 0},
	} {
		labels := map[string]string{"class": tc.id.Class, "identity": tc.id.Identity}
		between("nomad_device_zfs_backup_newest_age_seconds", labels, tc.id.NewestAt)
		must.EqOp(t, tc.streams, value(t, f, "nomad_device_zfs_backup_chain_streams", labels))
		must.EqOp(t, tc.bytes, value(t, f, "nomad_device_zfs_backup_chain_bytes", labels))
	}
	must.EqOp(t, 2.0, value(t, f, "nomad_device_zfs_backup_identities", nil))
	must.EqOp(t, float64(9<<20), value(t, f, "nomad_device_zfs_backup_dir_bytes", nil))
	must.EqOp(t, 1.0, value(t, f, "nomad_device_zfs_backup_forked_identities", nil))
	between("nomad_device_zfs_backup_listing_age_seconds", nil, now.Add(-10*time.Minute))
	// The labels are exactly class and identity.
	for _, s := range f["nomad_device_zfs_backup_chain_bytes"].GetMetric() {
		var names []string
		for _, l := range s.GetLabel() {
			names = append(names, l.GetName())
		}
		must.Eq(t, []string{"class", "identity"}, names)
	}

	// A backup newer than the scrape (another node's clock) is 0 s old.
	src.mu.Lock()
	src.backups.Identities[0].NewestAt = time.Now().Add(time.Hour)
	src.mu.Unlock()
	f = gather(t, m)
	must.EqOp(t, 0.0, value(t, f, "nomad_device_zfs_backup_newest_age_seconds", map[string]string{"identity": db.Identity}))
}

// The per-identity gauges are bounded: with more identities than
// MaxBackupIdentities, only those whose newest backup is the newest have
// series; the totals count every identity. Two identities that show alike
// make one series, not a failed scrape.
func TestMetrics_BackupGaugesBounded(t *testing.T) {
	now := time.Now()
	const extra = 5
	var ids []metrics.BackupIdentity
	for i := 0; i < metrics.MaxBackupIdentities+extra; i++ { // i minutes old
		ids = append(ids, metrics.BackupIdentity{Class: "state", Identity: fmt.Sprintf("default/job-%04d/g[0]/t (state)", i),
			NewestAt: now.Add(-time.Duration(i) * time.Minute), ChainStreams: 1, ChainBytes: 1})
	}
	ids = append(ids, ids[0]) // the newest twice
	src := &fakeSource{backups: metrics.Backups{Identities: ids, Bytes: 1 << 30, ListedAt: now}, backupsKnown: true}
	m := metrics.New(src)
	f := gather(t, m)

	for _, name := range []string{"backup_newest_age_seconds", "backup_chain_bytes", "backup_chain_streams"} {
		must.SliceLen(t, metrics.MaxBackupIdentities, f["nomad_device_zfs_"+name].GetMetric(), must.Sprint(name))
	}
	_, ok := f.Value("nomad_device_zfs_backup_chain_streams", map[string]string{"identity": ids[metrics.MaxBackupIdentities-1].Identity})
	must.True(t, ok, must.Sprint("the newest identities are in"))
	for i := metrics.MaxBackupIdentities; i < metrics.MaxBackupIdentities+extra; i++ {
		_, ok := f.Value("nomad_device_zfs_backup_chain_streams", map[string]string{"identity": ids[i].Identity})
		must.False(t, ok, must.Sprintf("identity %d of the oldest is dropped", i))
	}
	must.EqOp(t, float64(len(ids)), value(t, f, "nomad_device_zfs_backup_identities", nil))
}
