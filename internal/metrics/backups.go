package metrics

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxBackupIdentities bounds the identities that have series of their own
// in the per-identity backup gauges: those whose newest backup is the
// newest. Any others are in the totals only (backup_identities,
// backup_dir_bytes), so that a backup_dir of many identities cannot make
// the series explode.
const MaxBackupIdentities = 1000

// BackupIdentity is one identity's newest backup, as the keeper last
// listed backup_dir.
type BackupIdentity struct {
	Class string
	// Identity is the identity as the plugin logs it
	// ("ns/job/group[N]/task (class)").
	Identity string
	// NewestAt is the time of the newest backup's data (its release, or
	// a live backup's snapshot).
	NewestAt time.Time
	// ChainStreams and ChainBytes are the chain that restores the newest
	// backup: 0 when it is broken.
	ChainStreams int
	ChainBytes   int64
	// Forked says that its data forked at the newest backup: a restore
	// refuses until the operator sets one fork aside.
	Forked bool
}

// Backups is backup_dir, for this node's classes that back up, as the
// keeper's passes last listed it.
type Backups struct {
	Identities []BackupIdentity
	// Bytes is the size of every stream of those identities, older
	// chains included.
	Bytes int64
	// ListedAt is when a pass last listed the whole of backup_dir.
	ListedAt time.Time
}

// BackupSource is what the backup gauges read at each scrape: the
// keeper's last listing, never backup_dir itself.
type BackupSource interface {
	// Backups returns backup_dir as last listed; known is false without a
	// backup_dir, or before a pass has listed it.
	Backups() (b Backups, known bool)
}

// backupCollector computes the backup gauges at each scrape from the
// source's last listing; the ages from the times it holds.
type backupCollector struct {
	src                     BackupSource
	age, chainBytes, chainN *prometheus.Desc
	identities, bytes       *prometheus.Desc
	forked, listedAge       *prometheus.Desc
}

func newBackupCollector(src BackupSource) *backupCollector {
	perID := []string{"class", "identity"}
	return &backupCollector{
		src: src,
		age: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_newest_age_seconds"),
			fmt.Sprintf("Per identity in backup_dir (at most the %d with the newest backups): seconds since the time of the newest backup's data (its release, or a live backup's snapshot).", MaxBackupIdentities),
			perID, nil),
		chainBytes: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_chain_bytes"),
			"Per identity in backup_dir (as backup_newest_age_seconds): bytes of the chain of streams that restores the newest backup; 0 when that chain is broken.",
			perID, nil),
		chainN: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_chain_streams"),
			"Per identity in backup_dir (as backup_newest_age_seconds): streams in the chain that restores the newest backup (a full stream and its increments); 0 when that chain is broken.",
			perID, nil),
		identities: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_identities"),
			"Identities of this node's classes with a backup in backup_dir, as last listed.",
			nil, nil),
		bytes: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_dir_bytes"),
			"Bytes of every stream in backup_dir of this node's classes (older chains included), as last listed.",
			nil, nil),
		forked: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_forked_identities"),
			"Identities of this node's classes whose data forked at their newest backup in backup_dir, as last listed: a restore of them refuses until one fork is set aside (nomad-device-zfs backups set-aside).",
			nil, nil),
		listedAge: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "backup_listing_age_seconds"),
			"Seconds since the plugin last listed the whole of backup_dir (hourly; identities it backs up are listed again at each backup).",
			nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *backupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.age, c.chainBytes, c.chainN, c.identities, c.bytes, c.forked, c.listedAge} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: nothing without a listing.
func (c *backupCollector) Collect(ch chan<- prometheus.Metric) {
	b, ok := c.src.Backups()
	if !ok {
		return
	}
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(c.identities, prometheus.GaugeValue, float64(len(b.Identities)))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(b.Bytes))
	forked := 0
	for _, id := range b.Identities {
		if id.Forked {
			forked++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.forked, prometheus.GaugeValue, float64(forked))
	ch <- prometheus.MustNewConstMetric(c.listedAge, prometheus.GaugeValue, ageSeconds(now, b.ListedAt))
	for _, id := range newestBackups(b.Identities, MaxBackupIdentities) {
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, ageSeconds(now, id.NewestAt), id.Class, id.Identity)
		ch <- prometheus.MustNewConstMetric(c.chainBytes, prometheus.GaugeValue, float64(id.ChainBytes), id.Class, id.Identity)
		ch <- prometheus.MustNewConstMetric(c.chainN, prometheus.GaugeValue, float64(id.ChainStreams), id.Class, id.Identity)
	}
}

// newestBackups returns the at most n identities of ids whose newest
// backup is the newest, newest first (ties by identity), one per label
// pair (class, identity) whatever ids holds; ids is not changed.
func newestBackups(ids []BackupIdentity, n int) []BackupIdentity {
	out := append([]BackupIdentity(nil), ids...)
	sort.Slice(out, func(i, j int) bool {
		if !out[i].NewestAt.Equal(out[j].NewestAt) {
			return out[i].NewestAt.After(out[j].NewestAt)
		}
		return out[i].Identity < out[j].Identity
	})
	seen := make(map[[2]string]bool, len(out))
	out = slices.DeleteFunc(out, func(id BackupIdentity) bool {
		key := [2]string{id.Class, id.Identity}
		dup := seen[key]
		seen[key] = true
		return dup
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// ageSeconds is the seconds from t to now; 0 for a t ahead of now (another
// node's clock).
func ageSeconds(now, t time.Time) float64 {
	if d := now.Sub(t); d > 0 {
		return d.Seconds()
	}
	return 0
}
