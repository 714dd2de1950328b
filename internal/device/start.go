package device

// The plugin's background parts, started once by the first fingerprint
// stream and running for as long as it does: the metrics server's end, the
// shared classes' reads, retention, backups, and, when the Nomad API can be
// reached, the allocation watcher, the node metadata and the slot
// manager's release loop.

import (
	"context"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
)

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
	p.slots.SetNomad(slots.FromWatcher(w))
	go func() {
		if id, err := w.NodeID(ctx); err == nil {
			p.keeper.SetNode(id) // named in backup manifests
		}
	}()
	go p.meta.Run(ctx, w, RetentionPeriod, MetaDeniedBackoff)
	go w.Run(ctx, func(*allocwatch.Snapshot) { p.slots.Kick() })
	go p.slots.Run(ctx, s.FingerprintPeriod)
}
