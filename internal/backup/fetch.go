package backup

// A restore on a node with no archive of the identity: its newest chain
// received from backup_dir into the archive container.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Fetch receives the newest backup of owner o's identity in class from
// backup_dir into the archive container, named as its release named it,
// with the newest backups of the other slots of the same allocation (one
// per device it held), and returns the newest's archive name, when it was released after local (the
// identity's newest local archive; zero for none); "" when backup_dir
// holds none newer (or none is configured). A chain that does not verify
// is an error and nothing is received; what a failed receive left is
// destroyed. When the identity's data forked at the newer of the two (see
// record.Diverged), nothing is received and the error is a
// *DivergedError, the local archive newest or not: which fork the job
// wants cannot be known. The backups of allocations the operator set
// aside (SetAside) are never restored, nor a local archive of one. ctx
// bounds the whole (Reserve's reserve_timeout).
func (k *Keeper) Fetch(ctx context.Context, class string, o record.Owner, local retention.Archive) (string, error) {
	return k.FetchAfter(ctx, class, o, local, record.Awaited{})
}

// FetchAfter is Fetch for an owner whose data must be, at least, that of
// allocation after.Alloc (its predecessor on another node; "" for none):
// while neither the local archive nor backup_dir holds its final backup of
// each slot of after.Slots (a live one is not its final data; a final one
// of an allocation of after.Passed whose lineage names it serves as well),
// and the operator did not set it aside, nothing is received and the error
// wraps record.ErrNotArrived. Its release on its node sends it.
func (k *Keeper) FetchAfter(ctx context.Context, class string, o record.Owner, local retention.Archive, after record.Awaited) (string, error) {
	cfg, _ := k.config()
	if cfg.Dir == "" || !cfg.Classes[class] || !o.Known() || o.AllocIndex() < 0 || o.Truncated() {
		return "", nil
	}
	id := retention.IdentityOf(class, o)
	// A live backup newest: wait a little for its allocation's final
	// stream (its release on its node sends it within seconds), outside
	// fetchMu, which restores of other identities take.
	// (Not while a predecessor is awaited: its final data is what is
	// waited for, below.)
	if newest, err := k.newest(cfg.Dir, id); err == nil && newest.Live && newerThanLocal(newest, local) && after.Alloc == "" {
		k.settle(ctx, cfg.Dir, id)
	}
	k.fetchMu.Lock()
	defer k.fetchMu.Unlock()
	all, problems, err := List(cfg.Dir, &id)
	if err != nil {
		return "", err
	}
	// The operator's choice between forks, read again here (not from the
	// manifests: it outlives the streams it names).
	aside, err := readSetAside(IdentityDir(cfg.Dir, id))
	if err != nil {
		return "", fmt.Errorf("which backups of %s are set aside: %w", id, err)
	}
	if after.Alloc != "" && !aside[after.Alloc] && !holds(after, local.AllocID, local.From) {
		if why := notArrived(all, after); why != "" {
			return "", fmt.Errorf("%w: backup_dir holds %s of allocation %s (node %s), whose data %s must start with; its release on its node sends it. "+
				"If it never will (see that node's plugin log), set it aside: nomad-device-zfs backups set-aside -alloc %s -identity %s",
				record.ErrNotArrived, why, after.Alloc, record.ShortID(after.Node), o, after.Alloc, filepath.Base(IdentityDir(cfg.Dir, id)))
		}
	}
	// The data of allocations set aside is never restored; their streams
	// may still be the bases of others'.
	ms := notSetAside(all)
	var chain []Manifest
	var newest Manifest
	if len(ms) > 0 {
		if chain, err = chainOf(all, ms[0]); err != nil {
			return "", err
		}
		newest = chain[len(chain)-1]
	}
	if aside[local.AllocID] && local.AllocID != "" {
		if len(ms) == 0 || !newerThanLocal(newest, local) {
			return "", fmt.Errorf("%w: %s (allocation %s) is newer than any backup of %s not set aside; "+
				"rename it out of %s (zfs rename %s <pool>/<elsewhere>), and the restore takes the other fork",
				ErrSetAsideLocal, local.Name, local.AllocID, id, cfg.Container, local.Name)
		}
		local = retention.Archive{} // older than what is received, and out of the choice
	}
	if len(ms) == 0 {
		switch {
		case len(all) > 0 && local.Name == "":
			return "", fmt.Errorf("%w: %d backups of %s in %s, each of an allocation set aside; take one back (backups set-aside -undo)",
				ErrAllSetAside, len(all), id, IdentityDir(cfg.Dir, id))
		case len(problems) > 0 && len(all) == 0:
			return "", fmt.Errorf("backup_dir holds no readable backup of %s: %s: %s", id, problems[0].Path, problems[0].Reason)
		}
		return "", nil
	}
	if err := forkAt(id, ms, newest, local); err != nil {
		return "", err
	}
	if !newerThanLocal(newest, local) && (local.AllocID != newest.AllocID || len(newestPerSlot(ms, newest.AllocID)) < 2) {
		// The local archive is as new. (Of the same allocation with
		// several slots, a restore cut short may have received some of
		// them: the rest are received below, the others skipped.)
		return "", nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, SendTimeout)
		defer cancel()
	}
	if lag := cfg.MaxLag[class]; newest.Live && lag > 0 && time.Since(newest.ReleasedAt) > lag {
		return "", &StaleError{Identity: id, Newest: newest, Age: time.Since(newest.ReleasedAt).Truncate(time.Second), MaxLag: lag}
	}
	// Every slot of the newest allocation: an allocation that held
	// several devices left a backup of each, each its own chain, and a
	// restore takes them all (ClaimNewest, after this, claims every
	// archive of the newest allocation).
	chains, err := slotChains(all, ms, chain)
	if err != nil {
		return "", err
	}
	var got string
	for i, c := range chains {
		target, err := k.receiveChain(ctx, cfg, id, class, c)
		if err != nil {
			// What was received of the others stays: archives of the
			// identity, which retention keeps or prunes.
			return "", err
		}
		if i == 0 {
			got = target
		}
	}
	return got, nil
}

// slotChains returns the chains that restore each slot of the allocation
// whose backup chain restores (the newest, its chain checked): chain
// first, then for each other slot of that allocation the chain of its
// newest backup among ms (newest first, not set aside), by slot; their
// bases may be any of all. A slot whose chain is broken is an error:
// nothing of the allocation is then received, rather than a part of its
// data.
func slotChains(all, ms []Manifest, chain []Manifest) ([][]Manifest, error) {
	newest := chain[len(chain)-1]
	out := [][]Manifest{chain}
	others := slices.DeleteFunc(newestPerSlot(ms, newest.AllocID), func(m Manifest) bool { return m.Slot == newest.Slot })
	sort.Slice(others, func(i, j int) bool { return others[i].Slot < others[j].Slot })
	for _, m := range others {
		c, err := chainOf(all, m)
		if err != nil {
			return nil, fmt.Errorf("slot %d of allocation %s: %w", m.Slot, m.AllocID, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// holds reports whether data of allocation alloc, of lineage from, is
// after's: of after.Alloc, or of an allocation after.Passed names whose
// lineage names after.Alloc (it took that data and never ran).
func holds(after record.Awaited, alloc string, from record.Lineage) bool {
	return alloc != "" && (alloc == after.Alloc || slices.Contains(after.Passed, alloc) && slices.Contains(from, after.Alloc))
}

// notArrived says what all (one identity's manifests, newest first) lack
// of after's final data (see holds), slot by slot (after.Slots; none: each
// slot it left a backup of, at least one): "no backup" of a slot, "only a
// live backup" of one (taken while it ran); "" when each has its final.
func notArrived(all []Manifest, after record.Awaited) string {
	newest := map[int]Manifest{}
	for _, m := range all {
		if _, seen := newest[m.Slot]; !seen && holds(after, m.AllocID, m.From) {
			newest[m.Slot] = m
		}
	}
	slots := after.Slots
	if len(slots) == 0 {
		if len(newest) == 0 {
			return "no backup"
		}
		for s := range newest {
			slots = append(slots, s)
		}
		sort.Ints(slots)
	}
	for _, s := range slots {
		m, ok := newest[s]
		switch {
		case !ok:
			return fmt.Sprintf("no backup of slot %d", s)
		case m.Live:
			return fmt.Sprintf("only a live backup (taken %s) of slot %d", m.ReleasedAt.UTC().Format(time.RFC3339), s)
		}
	}
	return ""
}

// newestPerSlot returns, for each slot that ms (newest first) holds
// backups of for allocation alloc, its newest, in ms's order.
func newestPerSlot(ms []Manifest, alloc string) []Manifest {
	var out []Manifest
	seen := map[int]bool{}
	for _, m := range ms {
		if m.AllocID == alloc && !seen[m.Slot] {
			seen[m.Slot] = true
			out = append(out, m)
		}
	}
	return out
}

// receiveChain receives chain (one slot's backups, full stream first) into
// the archive container under the name its release gave it, and returns
// that name; a dataset of that name already there is taken as received.
func (k *Keeper) receiveChain(ctx context.Context, cfg Config, id retention.Identity, class string, chain []Manifest) (string, error) {
	newest := chain[len(chain)-1]
	prev := record.Owner{AllocID: newest.AllocID, Namespace: id.Namespace, Job: id.Job, Group: id.Group, Task: id.Task}
	prefix := cfg.Container + "/"
	target := prefix + record.ArchiveLeaf(class, newest.Slot, prev, newest.ReleasedAt, record.MaxNameLen-len(prefix))
	// Never into (nor, on failure, destroying) a dataset that exists.
	if ok, err := k.exists(ctx, target); err != nil {
		return "", err
	} else if ok {
		return target, nil
	}
	keyID := newest.KeyID
	for _, m := range chain {
		if m.KeyID != keyID {
			return "", fmt.Errorf("backup chain of %s mixes keys (%q in %s, %q in the newest): not received", id, m.KeyID, m.Path(), keyID)
		}
	}
	installed := false
	if keyID != "" {
		var err error
		if installed, err = installKey(cfg.Dir, id, cfg.KeyDir, keyID); err != nil {
			return "", fmt.Errorf("backup of %s: %w", id, err)
		}
	}
	// The chain is received under a name that is no archive's (a leaf
	// starting with '.': retention and the keeper's passes never take it
	// for one), marked as in backup_dir, and only then renamed to the
	// archive's name: no pass sends it, and no retention destroys it,
	// while it is received.
	recv, err := receivingName(cfg.Container)
	if err != nil {
		return "", err
	}
	received := func() error {
		if err := Receive(ctx, k.zfs, chain, recv); err != nil {
			return err
		}
		if keyID != "" {
			// The sender's keylocation came with the stream; the key is
			// here now.
			if err := k.zfs.Set(ctx, recv, "keylocation", record.KeyLocation(cfg.KeyDir, keyID)); err != nil {
				return err
			}
		}
		if newest.Live {
			// A live backup's stream carries the marks of a dataset in
			// use (reserved or armed, mountable): it arrives as an
			// archive, which retention and a restore take it for.
			for _, p := range [][2]string{{record.PropState, string(record.StateArchived)}, {"canmount", "noauto"}} {
				if err := k.zfs.Set(ctx, recv, p[0], p[1]); err != nil {
					return err
				}
			}
		}
		if err := k.zfs.Set(ctx, recv, retention.PropBackup, strconv.FormatUint(newest.GUID, 10)); err != nil {
			return err
		}
		// The chain's older snapshots came with it; the newest is the
		// base of the next increment, the rest are released.
		k.releaseSnapshots(ctx, recv, recv+"@"+newest.Snapshot)
		return k.zfs.Rename(ctx, recv, target)
	}
	if err := received(); err != nil {
		if derr := k.zfs.DestroyRecursive(context.WithoutCancel(ctx), recv, cfg.Container); derr != nil && !errors.Is(derr, zfs.ErrNotExist) {
			k.log.Error("a failed receive left a dataset that cannot be destroyed", "dataset", recv, "error", derr)
		} else if installed {
			if rerr := record.RemoveKey(cfg.KeyDir, keyID); rerr != nil {
				k.log.Warn("the key installed for a failed receive could not be removed", "key_id", keyID, "error", rerr)
			}
		}
		return "", err
	}
	k.log.Info("received a backup from backup_dir", "dataset", target, "identity", id.String(), "streams", len(chain), "from_node", newest.Node,
		"live", newest.Live, "taken", newest.ReleasedAt, "age", time.Since(newest.ReleasedAt).Truncate(time.Second))
	return target, nil
}

// newerThanLocal reports whether newest, the newest of one identity's
// manifests, was released after local, the identity's newest local
// archive (zero Name: none).
func newerThanLocal(newest Manifest, local retention.Archive) bool {
	return local.Name == "" || newest.ReleasedAt.After(local.ReleasedAt)
}

// receivingName returns a new name in the archive container for a receive
// under way: ".recv-<random>", which no archive name can be (ParseArchiveLeaf
// refuses it), so that neither retention nor a pass takes it for an archive.
func receivingName(container string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("naming a receive: %w", err)
	}
	return container + "/.recv-" + hex.EncodeToString(b[:]), nil
}
