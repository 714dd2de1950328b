package restore

// The predecessor whose data a restore waits for: the allocation the asker
// replaced on another node, whose release there sends its data to
// backup_dir. Until it arrives, the newest data there is older (a release
// before it), or there is none: a restore then would start the job on data
// from before its predecessor's run, or empty, and nothing would say so.

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
)

// maxPriorHops bounds the walk back through replacements that never ran
// (a replacement whose Reserve failed, itself replaced, ...).
const maxPriorHops = record.MaxLineage

// awaited returns the data that asker (in class c, on the node of read
// v) must start with and that may still be on its way to backup_dir: that
// of the allocation it replaced (Nomad's PreviousAllocation), or, when
// that one never ran its task, of the one that replaced in turn, up to
// maxPriorHops back. It is zero when there is none to wait for: no
// predecessor, or one that
//   - ran on this node (its data is here, in a slot or in the archive:
//     see predecessorSlot);
//   - never held a device of the class with asker's task (it wrote none);
//   - is lost, or its node disconnected (unknown): its node is gone, and
//     what it left is the newest backup there is (a live one, bounded by
//     max_restore_lag); its final stream comes only if the node returns.
//
// Otherwise (it ran elsewhere and is over, or stopping, or still running)
// its release there sends its data, and the restore waits for it. Any
// doubt is an error: a read that fails, an allocation of the chain that
// Nomad no longer has (collected: what it was cannot be told), a chain of
// replacements that never ran longer than maxPriorHops.
func awaited(ctx context.Context, nomad allocs.Nomad, v *allocs.View, c string, asker record.Owner) (record.Awaited, error) {
	a, ok := v.Allocs[asker.AllocID]
	if !ok {
		return record.Awaited{}, fmt.Errorf("%s is not in the read of the node's allocations", asker)
	}
	var passed []string
	for id := a.Previous; id != ""; {
		if len(passed) >= maxPriorHops {
			return record.Awaited{}, fmt.Errorf("%s replaced %d allocations in a row that never ran (the last %s): which ran before them is not looked for",
				asker, len(passed), record.ShortID(passed[len(passed)-1]))
		}
		p, err := nomad.Prior(ctx, asker.Namespace, id)
		switch {
		case err != nil:
			return record.Awaited{}, fmt.Errorf("reading allocation %s, which %s replaced: %w", record.ShortID(id), asker, err)
		case !p.Exists:
			return record.Awaited{}, fmt.Errorf("allocation %s, which %s replaced, is no longer known to Nomad (collected): whether its data is in backup_dir cannot be told", id, asker)
		case !p.Started[asker.Task]:
			// Never ran: what it replaced left the data (or this one
			// took it, and its release leaves it).
			passed = append(passed, id)
			id = p.Previous
			continue
		case p.NodeID == v.NodeID || p.ClientStatus == "lost" || p.ClientStatus == "unknown":
			return record.Awaited{}, nil
		}
		slots := classSlots(p.Devices, asker.Task, c)
		if len(slots) == 0 {
			return record.Awaited{}, nil
		}
		return record.Awaited{Alloc: p.ID, Node: p.NodeID, Slots: slots, Passed: passed}, nil
	}
	return record.Awaited{}, nil
}

// classSlots returns, in order, the indexes of the devices of class c
// that devices (device ID to task) give task (record.DeviceID: the class,
// a dash, the slot's index).
func classSlots(devices map[string]string, task, c string) []int {
	var out []int
	for id, t := range devices {
		if t != task {
			continue
		}
		if n, ok := strings.CutPrefix(id, c+"-"); ok {
			if i := record.ParseIndex(n); i >= 0 {
				out = append(out, i)
			}
		}
	}
	sort.Ints(out)
	return out
}
