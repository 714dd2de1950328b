package restore

// The predecessor whose data a restore waits for: the allocation the asker
// replaced on another node, whose release there sends its data to
// backup_dir. Until it arrives, the newest data there is older (a release
// before it), or there is none: a restore then would start the job on data
// from before its predecessor's run, or empty, and nothing would say so.

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/allocs"
)

// maxPriorHops bounds the walk back through replacements that never ran
// (a replacement whose Reserve failed, itself replaced, ...).
const maxPriorHops = record.MaxLineage

// awaited returns the allocation whose data asker (in class c, on the
// node of read v) must start with and that may still be on its way to
// backup_dir: the allocation it replaced (Nomad's PreviousAllocation),
// or, when that one never ran its task, the one that replaced in turn, up
// to maxPriorHops back. It is "" when there is none to wait for: no
// predecessor, or one that
//   - no longer exists (collected: long over);
//   - ran on this node (its data is here, in a slot or in the archive:
//     see predecessorSlot);
//   - never held a device of the class with asker's task (it wrote none);
//   - is lost, or its node disconnected (unknown): its node is gone, and
//     what it left is the newest backup there is (a live one, bounded by
//     max_restore_lag); its final stream comes only if the node returns.
//
// Otherwise (it ran elsewhere and is over, or stopping, or still running)
// its release there sends its data, and the restore waits for it. node is
// where it ran. Any doubt is an error.
func awaited(ctx context.Context, nomad allocs.Nomad, v *allocs.View, c string, asker record.Owner) (id, node string, err error) {
	a, ok := v.Allocs[asker.AllocID]
	if !ok {
		return "", "", fmt.Errorf("%s is not in the read of the node's allocations", asker)
	}
	id = a.Previous
	for hop := 0; id != "" && hop < maxPriorHops; hop++ {
		p, err := nomad.Prior(ctx, asker.Namespace, id)
		switch {
		case err != nil:
			return "", "", fmt.Errorf("reading allocation %s, which %s replaced: %w", record.ShortID(id), asker, err)
		case !p.Exists:
			return "", "", nil
		case !p.Started[asker.Task]:
			// Never handed a dataset: what it replaced left the data.
			id = p.Previous
			continue
		case p.NodeID == v.NodeID || !heldClass(p.Devices, asker.Task, c):
			return "", "", nil
		case p.ClientStatus == "lost" || p.ClientStatus == "unknown":
			return "", "", nil
		}
		return p.ID, p.NodeID, nil
	}
	return "", "", nil
}

// heldClass reports whether devices (device ID to task) give task a device
// of class c (record.DeviceID: the class, a dash, the slot's index).
func heldClass(devices map[string]string, task, c string) bool {
	for id, t := range devices {
		if t != task {
			continue
		}
		if n, ok := strings.CutPrefix(id, c+"-"); ok {
			if _, err := strconv.Atoi(n); err == nil {
				return true
			}
		}
	}
	return false
}
