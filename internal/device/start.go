package device

// The plugin's background parts, started once by the first fingerprint
// stream and running for as long as it does: the metrics server's end, the
// shared classes' reads, retention, backups, and, when the Nomad API can be
// reached, the allocation watcher, the node metadata and the slot
// manager's release loop.

import (
	"context"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
)

// nodeIDRetry is how long the plugin waits before it asks again for its
// node's ID, which the agent may not answer yet at start.
const nodeIDRetry = 5 * time.Second

// startWatching starts, once, the background parts, for as long as ctx
// (the fingerprint stream's, which lives as long as the plugin) is not
// done. Without a watcher nothing is ever released.
func (p *Plugin) startWatching(ctx context.Context) {
	p.mu.Lock()
	s, standIn := p.settings, p.standIn
	if p.watching {
		p.mu.Unlock()
		return
	}
	p.watching = true
	p.mu.Unlock()

	// The metrics server lives as long as the plugin does.
	go func() {
		<-ctx.Done()
		p.Close()
	}()
	// Retention and backups need no Nomad: they run even when the
	// watcher cannot.
	go p.shared.Run(ctx, s.FingerprintPeriod, sharedReadTimeout)
	go p.pruner.Run(ctx, RetentionPeriod)
	go p.keeper.Run(ctx, RetentionPeriod)
	go p.keeper.RunLive(ctx)
	if standIn != nil {
		return // the caller runs the release passes (UseAllocations)
	}

	w, err := allocwatch.New(s.Nomad, p.log.Named("allocwatch"))
	if err != nil {
		p.log.Error("cannot watch allocations; no dataset will be released", "error", err)
		return
	}
	p.log.Info("watching allocations", "address", w.Address())
	w.SetObserver(p.metrics)
	p.slots.SetNomad(allocs.FromWatcher(w))
	// The node ID is named in backup manifests; the agent's API may not
	// answer yet when the plugin starts: tried until it does.
	go loop.Run(ctx, loop.Config{Name: "node ID", Log: p.log, First: loop.After(0)}, func(ctx context.Context, _ loop.Wake) loop.Next {
		id, err := w.NodeID(ctx)
		if err != nil {
			p.log.Debug("the node ID is not known yet; backup manifests name none until it is", "error", err)
			return loop.After(nodeIDRetry)
		}
		p.keeper.SetNode(id)
		return loop.Stop(nil)
	})
	go p.meta.Run(ctx, w, RetentionPeriod, MetaDeniedBackoff)
	go w.Run(ctx, func(*allocwatch.Snapshot) { p.slots.Kick() })
	go p.slots.Run(ctx, s.FingerprintPeriod)
}
