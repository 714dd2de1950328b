// Package slots holds the slot state machine: for each configured class, the
// datasets <parent>/<class>/<index> (and their spares, <index>.alt: see
// pair.go) that the plugin offers as device instances. It adopts what
// exists, creates what is missing, destroys free slots beyond the
// configured count, hands slots to tasks (Reserve) and takes them back when
// their allocation is over. What it records on ZFS (properties, states and
// their transitions, owners, names) is package record's; it keeps no side
// file, so the plugin can be killed at any point and start again from what
// ZFS says.
//
// Where to look (docs/architecture.md draws the paths through them):
//
//   - The manager and its parts: manager.go (Manager, its locks and what
//     each guards), slot.go (Slot, one device instance as last seen),
//     locks.go (per-slot locks and versions), config.go (Config, Class),
//     nomad.go and watcher.go (what the manager asks of Nomad, answered by
//     the allocation watcher), hooks.go (metrics), loop.go (Run).
//   - Reserve: reserve.go (the call), fresh.go (a fresh slot: one zfs
//     command, or none when armed), armed.go and adopt.go (armed datasets),
//     prepare.go and prepare_claim.go (the work done at placement, claimed
//     by the Reserve), proof.go (a prepared slot's asker proven behind the
//     answer, the slot closed until then), decide.go (hand over, release or keep: the judgment
//     Reserve and the release pass share), restore.go (an archive back for
//     its identity), owners.go (owners recorded behind the Reserve),
//     starts.go (background work yields to starts).
//   - Release: release.go (the pass over ended allocations), fate.go (what
//     a release records first), release_run.go (one slot's release in the
//     background), release_known.go (its steps from what the manager
//     knows), slot_work.go (the work on one slot under its lock), hold.go
//     (a slot held for its next tenant).
//   - Reconcile: sync.go (Sync: read, plan, apply, until settled), plan.go
//     (MakePlan, pure), pair.go (a slot's two names and their roles),
//     apply.go (the plan carried out), slot_health.go (a slot's view and
//     health from one read, pure), pool.go (pool and parent health),
//     repair.go (datasets whose properties did not parse), observe.go (the
//     read-only view for the operator CLI).
//   - Mounts and spares: mounts.go (the host side of a free slot: nosuid,
//     nodev, owner and mode), spare.go (a slot's spare and its handover),
//     withheld.go (a spare a restart withholds), keys.go (encrypted
//     datasets' keys), health.go (what health says beyond ZFS).
package slots
