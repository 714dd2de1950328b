package device

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// ArchivesMetaKey is the node's dynamic metadata key that lists the job
// groups with data in this node's archive, as "namespace/job/group",
// comma-separated, so that a job can prefer the node that has its data:
//
//	affinity {
//	  attribute = "${meta.nomad_device_zfs.archives}"
//	  operator  = "set_contains"
//	  value     = "default/keeper/g"
//	}
const ArchivesMetaKey = "nomad_device_zfs.archives"

// maxMetaGroups bounds the groups listed in ArchivesMetaKey.
const maxMetaGroups = 500

// archivesMeta returns the value of ArchivesMetaKey for what the archive
// holds: each job group with a known owner, once, sorted; names holding a
// comma (which set_contains would split) are left out. "" for none.
func archivesMeta(archives []retention.Archive) string {
	seen := map[string]bool{}
	for _, a := range archives {
		id := a.Identity
		if id.Unknown {
			continue
		}
		g := id.Namespace + "/" + id.Job + "/" + id.Group
		if strings.ContainsAny(g, ",\n\t") {
			continue
		}
		seen[g] = true
	}
	groups := make([]string, 0, len(seen))
	for g := range seen {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	if len(groups) > maxMetaGroups {
		groups = groups[:maxMetaGroups]
	}
	return strings.Join(groups, ",")
}

// metaSetter is what the publisher needs from the Nomad API.
type metaSetter interface {
	SetNodeMeta(ctx context.Context, meta map[string]*string) error
}

// MetaDeniedBackoff is how long the publisher waits, after Nomad refused
// the token node metadata (a 403: no node:write), before it tries again:
// an operator who grants node:write (the token file is read at each call)
// sees the metadata published within it, with no restart.
const MetaDeniedBackoff = 10 * time.Minute

// MetaGap is the least time between two writes of the node metadata. Each
// write is a node update on Nomad's servers, which evaluates again every
// job with an allocation on the node and every blocked evaluation: under
// a churn of short jobs, whose every release adds a job group to the
// list, writing at each retention pass (every 2 s, KickGap) made the
// scheduler's work of the node grow with the churn. A change after a
// quiet MetaGap goes out at once; the changes within it are written
// together, the latest value, MetaGap after the last write.
const MetaGap = 30 * time.Second

// metaPublisher keeps ArchivesMetaKey in the node's metadata in step with
// the archive, off the retention pass's path: Update records the latest
// value and wakes Run, which makes the Nomad call.
type metaPublisher struct {
	log  hclog.Logger
	kick chan struct{}

	// mu guards want, have, wrote, denied and deniedUntil.
	mu   sync.Mutex
	want *string // nil until the first Update
	have *string // what was last published; nil for nothing yet
	// wrote is when have was published; the next write is due no sooner
	// than MetaGap after it.
	wrote time.Time
	// denied: the last answer about permission was a refusal (a streak of
	// them, warned about once); deniedUntil is when the next try is due.
	denied      bool
	deniedUntil time.Time
}

func newMetaPublisher(log hclog.Logger) *metaPublisher {
	return &metaPublisher{log: log, kick: make(chan struct{}, 1)}
}

// Update records what the archive holds now. It never blocks.
func (m *metaPublisher) Update(archives []retention.Archive) {
	v := archivesMeta(archives)
	m.mu.Lock()
	m.want = &v
	m.mu.Unlock()
	loop.Kick(m.kick)
}

// Run publishes each new value until ctx is done, no sooner than MetaGap
// after the last write (the latest value then); a failed call is tried
// again at the next Update or after retry, a refused one (no node:write)
// only once backoff has passed (MetaDeniedBackoff in the plugin).
func (m *metaPublisher) Run(ctx context.Context, api metaSetter, retry, backoff time.Duration) {
	cfg := loop.Config{Name: "node metadata", Log: m.log, First: loop.After(0), Kick: m.kick}
	loop.Run(ctx, cfg, func(ctx context.Context, _ loop.Wake) loop.Next {
		m.mu.Lock()
		want, have, denied, until := m.want, m.have, m.denied, m.deniedUntil
		next := m.wrote.Add(MetaGap)
		m.mu.Unlock()
		if wait := time.Until(until); denied && wait > 0 {
			return loop.After(wait) // an Update meanwhile waits for it too
		}
		if want == nil || (have != nil && *have == *want) {
			return loop.After(retry)
		}
		if wait := time.Until(next); have != nil && wait > 0 {
			return loop.After(wait) // the Updates meanwhile are written together
		}
		var val *string
		if *want != "" {
			val = want
		}
		err := api.SetNodeMeta(ctx, map[string]*string{ArchivesMetaKey: val})
		m.mu.Lock()
		defer m.mu.Unlock()
		switch {
		case err == nil:
			m.have, m.wrote = want, time.Now()
			if m.denied {
				m.denied = false
				m.log.Info("node metadata written again: jobs can prefer the node that holds their archived data", "key", ArchivesMetaKey)
			}
		case errors.Is(err, allocwatch.ErrPermission):
			if !m.denied {
				m.log.Warn("the token may not write node metadata (node:write): jobs cannot prefer the node that holds their archived data; going on without it, and trying again from time to time",
					"key", ArchivesMetaKey, "retry_in", backoff, "error", err)
			} else {
				m.log.Debug("node metadata still refused; trying again later", "key", ArchivesMetaKey, "retry_in", backoff, "error", err)
			}
			m.denied, m.deniedUntil = true, time.Now().Add(backoff)
			return loop.After(backoff)
		default:
			m.log.Debug("publishing node metadata failed; trying again", "key", ArchivesMetaKey, "error", err)
		}
		return loop.After(retry)
	})
}
