// Package slots holds the slot engine: for each configured class, the
// datasets <parent>/<class>/<index> (and their spares, <index>.alt: see
// reconcile.Pair) that the plugin offers as device instances. It adopts
// what exists, creates what is missing, destroys free slots beyond the
// configured count, hands slots to tasks (Reserve) and takes them back when
// their allocation is over. What it records on ZFS (properties, states and
// their transitions, owners, names) is package record's; it keeps no side
// file, so the plugin can be killed at any point and start again from what
// ZFS says.
//
// Its parts below it, each a package of its own (docs/architecture.md
// draws them, and the paths of a Reserve and a release through them):
//
//   - reconcile: Config and Class, a slot's two names and their roles
//     (Pair), MakePlan and a release's steps; pure.
//   - view: Slot, the slot list and each slot's health from one read
//     (Build), what the manager knows beyond ZFS laid over it (Known,
//     KeepSchedulable), and the operator's read-only look (Observe).
//   - decide: hand over, release or keep an in-use slot, from one read of
//     the allocations (Decide), and whether an earlier run's armed
//     dataset or a withheld spare may be adopted; the manager carries it
//     out.
//   - keys: encrypted datasets' keys (Create, Remove).
//   - repair: exact re-reads of datasets whose batched read did not
//     parse, legacy owner properties cleaned.
//   - mounts: a slot's host side (nosuid, nodev, the root's owner and
//     mode).
//   - allocs: what the manager asks of the node's allocations (Nomad,
//     View), answered from the allocation watcher (FromWatcher).
//   - reserve: Reserve's rounds (fresh slots, reserved ones judged by
//     decide, restores, releases waited for), through the manager
//     (reserveSlots, in reserve.go).
//   - release: a release pass's decisions (Passer.Start), through the
//     manager (releaseSlots, in release_known.go); the runs that carry
//     releases and spares out, one per slot (Runs, with a lock of its
//     own); a release's steps decided without a read (Known, Dataset) and
//     their outcome settled without one (Settle); a release's fate state.
//   - prepare: the slots prepared at placement for the allocation Nomad
//     placed on them, and their handover to its Reserve, through the
//     manager (prepareSlots, in prepare.go).
//   - restore: an identity's archive back into fresh slots at Reserve, or
//     an ended allocation's dataset to its replacement, through the
//     manager (restoreSlots, in restore.go); it holds where archives are
//     found.
//   - fate: a dataset's fate, what its release writes first (Write), or
//     behind an armed spare's handover (Behind), through the manager
//     (fateSlots, in fate.go).
//   - spare: a slot's spare handed to a Reserve's asker (HandOver), through
//     the manager (spareSlots, in spare.go).
//   - apply: a plan's actions carried out on ZFS (Applier.All).
//   - armed, starts, hold, preps, proofs, tenancy, pool: the manager's parts
//     with locks of their own (this run's armed datasets, the starts under
//     way that background work yields to, the slots held for their next
//     tenant, the slots prepared at placement and the Reserves under way,
//     the gates of the proofs behind a prepared slot's Reserve, what is
//     known of a tenancy beyond ZFS, the pool's check).
//
// Where to look in this package:
//
//   - The manager: manager.go (Manager, its locks and what each guards),
//     slot.go, config.go and nomad.go (the types its users name, by alias),
//     locks.go (per-slot locks and versions), armed_zfs.go (every read of
//     ZFS as this run reads it), hooks.go (metrics), loop.go (Run).
//   - Reserve: reserve.go (the call, and the manager's side of package
//     reserve), fresh.go (a fresh slot marked: one zfs command, or none
//     when armed; who asked, recorded), adopt.go (an earlier run's armed
//     datasets), prepare.go (the manager's side of package prepare: a
//     free slot marked at placement, the preparations a Reserve claims),
//     proof.go (a prepared slot's asker proven behind the answer, the slot
//     closed until then by its gate in package proofs), restore.go (the
//     manager's side of package restore), owners.go (owners recorded
//     behind the Reserve), owner_mount.go (a reserved slot mounted before
//     it goes back to its owner).
//   - Release: release.go (the pass over ended allocations, the slots
//     held for their next tenant, and one slot's release in a run of
//     package release, yielding to starts), fate.go (the manager's side
//     of package fate), release_known.go (the manager's side of package
//     release: its steps from what the manager knows, settled),
//     slot_work.go (the work on one slot under its lock).
//   - Reconcile: sync.go (Sync: read, plan, apply, until settled), pool.go
//     (pool and parent health on every slot).
//   - Spares: spare.go (the manager's side of package spare), withheld.go
//     (a spare a restart withholds, adopted on decide's proof), health.go
//     (what the manager knows beyond ZFS, which health says).
package slots
