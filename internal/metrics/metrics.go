// Package metrics is the plugin's optional Prometheus endpoint: the
// collectors that the slot manager, the zfs runner and the allocation
// watcher report to (through the small observer interfaces each of them
// declares), the gauges computed at scrape time from the slot manager's
// last view, and the HTTP server that serves them.
//
// Every metric lives in a registry of its own per plugin instance; nothing
// is registered globally. Labels are bounded by the configuration and the
// code (class, device, state, command, subcommand, outcome, call, reason):
// never an allocation. The one label that names a job and a namespace is
// the backup gauges' identity, bounded to MaxBackupIdentities identities
// (backups.go).
package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Namespace prefixes every metric name.
const Namespace = "nomad_device_zfs"

// Slot states of the slots gauge. Every slot is in exactly one.
const (
	StateFree      = "free"      // empty, healthy, offered
	StateInUse     = "in_use"    // reserved by an allocation (healthy or kept unverified)
	StateReleasing = "releasing" // on its way to the archive or to be destroyed
	StateUnhealthy = "unhealthy" // not in use and not offered: missing, broken, pool down…
)

// states lists the slot states in the order they are reported.
var states = []string{StateFree, StateInUse, StateReleasing, StateUnhealthy}

// Source is what the scrape-time gauges read. Its methods must return the
// manager's last view at once: no zfs command runs at scrape time.
type Source interface {
	// Slots returns every slot as last observed.
	Slots() []slots.Slot
	// ParentAvailable returns the parent dataset's available space, as
	// last read; known is false when it was not.
	ParentAvailable() (bytes uint64, known bool)
	// Pool names the pool of the parent dataset ("" before configuration).
	Pool() string
	// BackupSource is backup_dir as the keeper last listed it.
	BackupSource
}

// Metrics holds one plugin instance's collectors and, when configured,
// its HTTP server. Its observer methods are safe for concurrent use and
// never block.
type Metrics struct {
	reg *prometheus.Registry

	zfsCommands     *prometheus.HistogramVec
	reserves        *prometheus.HistogramVec
	releasesStarted *prometheus.CounterVec
	releases        *prometheus.HistogramVec
	apiFailures     *prometheus.CounterVec

	server server
}

var (
	_ zfs.Observer        = (*Metrics)(nil)
	_ slots.Observer      = (*Metrics)(nil)
	_ allocwatch.Observer = (*Metrics)(nil)
)

// New returns the collectors of one plugin instance, registered in a
// registry of their own, with the gauges read from src at each scrape.
// Nothing is served until Serve.
func New(src Source) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		zfsCommands: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "zfs_command_duration_seconds",
			Help:    "zfs and zpool processes run by the plugin, by command, subcommand and outcome (ok, not_exist, busy, unavailable, no_space, invalid, timeout, error), and how long each ran.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"command", "subcommand", "outcome"}),
		reserves: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "reserve_duration_seconds",
			Help:    "Reserve calls from Nomad, by outcome (fresh: handed over at once; waited: after a wait for a release or for proof of who asks; failed), and how long each took.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"outcome"}),
		releasesStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "releases_started_total",
			Help: "Releases begun (a dataset's fate recorded on ZFS), by class.",
		}, []string{"class"}),
		releases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "release_duration_seconds",
			Help:    "Release runs that did work, by class and outcome (ok, error; a failed release is retried), and how long each took.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"class", "outcome"}),
		apiFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "nomad_api_read_failures_total",
			Help: "Failed reads of the Nomad API, by call (node_allocations, allocation, visibility, node_id) and reason (permission, timeout, error).",
		}, []string{"call", "reason"}),
	}
	m.reg.MustRegister(m.zfsCommands, m.reserves, m.releasesStarted, m.releases, m.apiFailures, newSlotCollector(src), newBackupCollector(src))
	return m
}

// Registry returns the registry that holds every metric of the instance.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// CommandDone implements zfs.Observer.
func (m *Metrics) CommandDone(command, subcommand string, err error, took time.Duration) {
	m.zfsCommands.WithLabelValues(command, subcommand, zfs.Outcome(err)).Observe(took.Seconds())
}

// ReserveDone implements slots.Observer.
func (m *Metrics) ReserveDone(outcome string, took time.Duration) {
	m.reserves.WithLabelValues(outcome).Observe(took.Seconds())
}

// ReleaseStarted implements slots.Observer.
func (m *Metrics) ReleaseStarted(class string) {
	m.releasesStarted.WithLabelValues(class).Inc()
}

// ReleaseDone implements slots.Observer.
func (m *Metrics) ReleaseDone(class string, err error, took time.Duration) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.releases.WithLabelValues(class, outcome).Observe(took.Seconds())
}

// ReadFailed implements allocwatch.Observer.
func (m *Metrics) ReadFailed(call string, err error) {
	reason := "error"
	switch {
	case errors.Is(err, allocwatch.ErrPermission):
		reason = "permission"
	case errors.Is(err, context.DeadlineExceeded):
		reason = "timeout"
	}
	m.apiFailures.WithLabelValues(call, reason).Inc()
}

// slotCollector computes the slot and space gauges from the source's last
// view at each scrape.
type slotCollector struct {
	src                Source
	slots, free, usedB *prometheus.Desc
}

func newSlotCollector(src Source) *slotCollector {
	return &slotCollector{
		src: src,
		slots: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "slots"),
			"Slots (device instances) by class and state (free, in_use, releasing, unhealthy), as the plugin last saw them.",
			[]string{"class", "state"}, nil),
		free: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "pool_free_bytes"),
			"Space the pool (and any quota on the parent dataset) still lets the slots write: the parent dataset's available space, as last read.",
			[]string{"pool"}, nil),
		usedB: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "slot_used_bytes"),
			"Space used by the dataset that serves each slot, snapshots included, as last read.",
			[]string{"class", "device"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *slotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.slots
	ch <- c.free
	ch <- c.usedB
}

// Collect implements prometheus.Collector. It reads a copy of the slot
// list and holds no lock while it sends.
func (c *slotCollector) Collect(ch chan<- prometheus.Metric) {
	all := c.src.Slots()
	counts := map[string]map[string]int{}
	var classes []string
	for _, s := range all {
		if counts[s.Class] == nil {
			counts[s.Class] = map[string]int{}
			classes = append(classes, s.Class)
		}
		counts[s.Class][SlotState(s)]++
		ch <- prometheus.MustNewConstMetric(c.usedB, prometheus.GaugeValue, float64(s.Usage.Used), s.Class, s.ID)
	}
	for _, class := range classes {
		for _, st := range states {
			ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(counts[class][st]), class, st)
		}
	}
	if b, ok := c.src.ParentAvailable(); ok {
		ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(b), c.src.Pool())
	}
}

// SlotState is the state a slot is counted in: releasing while its
// dataset is on its way out; in use while an allocation holds it (also
// when it is kept unverified, unhealthy); free when offered empty and
// healthy; unhealthy otherwise.
func SlotState(s slots.Slot) string {
	switch {
	case s.State == record.StateReleasing || s.State == record.StateDestroying:
		return StateReleasing
	case s.State == record.StateReserved:
		return StateInUse
	case s.State == record.StateFree && s.Healthy:
		return StateFree
	}
	return StateUnhealthy
}
