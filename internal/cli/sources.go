package cli

import (
	"fmt"
	"sort"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/view"
)

// olderSource lists, per older snapshot, the device IDs of a class's slots
// whose dataset was cloned from a snapshot other than the class's source
// now: they keep that snapshot from being destroyed until they are made
// again (free) or released (in use). Sorted.
type olderSource struct {
	Snapshot string   `json:"snapshot"`
	Devices  []string `json:"devices"`
}

// olderSources returns what depends on an older source in class cl.
func olderSources(cl slots.Class, all []slots.Slot) []olderSource {
	by := map[string][]string{}
	for _, s := range all {
		if s.Class != cl.Name || !s.Present() || s.Origin == "" || s.Origin == cl.Source {
			continue
		}
		by[s.Origin] = append(by[s.Origin], s.ID)
	}
	var out []olderSource
	for snap, ids := range by {
		sort.Strings(ids)
		out = append(out, olderSource{Snapshot: snap, Devices: ids})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Snapshot < out[j].Snapshot })
	return out
}

// describeOlder is olderSources for a person: "ci-1, ci-2 on tank/g@v41".
func describeOlder(older []olderSource) string {
	var parts []string
	for _, o := range older {
		parts = append(parts, fmt.Sprintf("%s on %s", strings.Join(o.Devices, ", "), o.Snapshot))
	}
	return strings.Join(parts, "; ")
}

// sourceCheck is doctor's "sources" check: each class's source, and the
// slots that still hold an older one (a warning: the operator cannot
// destroy that snapshot yet).
func sourceCheck(cfg slots.Config, obs view.Observation) (check, bool) {
	var msgs, waits []string
	for _, cl := range cfg.Classes {
		if cl.Source == "" {
			continue
		}
		msg := fmt.Sprintf("class %s: fresh slots are clones of %s", cl.Name, cl.Source)
		if older := olderSources(cl, obs.Slots); len(older) > 0 {
			msg += "; still on an older source: " + describeOlder(older)
			waits = append(waits, cl.Name)
		}
		msgs = append(msgs, msg)
	}
	if len(msgs) == 0 {
		return check{}, false
	}
	c := check{Name: "sources", Status: checkOK, Message: oneLine(strings.Join(msgs, "; "))}
	if len(waits) > 0 {
		c.Status = checkWarn
		c.Fix = "free slots are made again from the new source at the plugin's next fingerprint, slots in use when their allocation ends; destroy the old snapshot once none is listed (see docs/configuration.md#golden-sources)"
	}
	return c, true
}
