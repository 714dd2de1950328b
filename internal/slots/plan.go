// Package slots holds the slot state machine: for each configured class, the
// datasets <parent>/<class>/<index> that the plugin offers as device
// instances. It adopts what exists, creates what is missing, destroys free
// slots beyond the configured count, and records reservations. All durable
// state lives in ZFS user properties on the datasets themselves, never in a
// side file, so the plugin can be killed at any point and start again from
// what ZFS says.
package slots

import (
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// User properties the plugin sets. Only datasets that carry PropManaged with
// source "local" are ever changed by the plugin.
const (
	// PropManaged marks a dataset as the plugin's own: ManagedSlot on slot
	// datasets, ManagedClass on the per-class container datasets.
	PropManaged = "nomad-device-zfs:managed"
	// PropState records a slot's state (StateFree, StateReserved).
	PropState = "nomad-device-zfs:state"

	ManagedSlot  = "slot"
	ManagedClass = "class"
)

// State is the durable state of a slot, stored in PropState.
type State string

const (
	// StateFree: an empty dataset waiting for a task.
	StateFree State = "free"
	// StateReserved: Nomad has called Reserve for it.
	StateReserved State = "reserved"
)

// ObservedProps are the properties read by the one batched `zfs get` of every
// refresh, in the order they are asked for.
var ObservedProps = []string{
	"mounted", "mountpoint", "used", "available", "referenced", "compressratio",
	"refquota", PropManaged, PropState,
}

// Class is one validated class of the operator's configuration.
type Class struct {
	Name      string
	Slots     int
	Quota     uint64
	MountPath string
	ReadOnly  bool
	UID, GID  int
	Mode      os.FileMode
	// Properties are extra ZFS properties for new datasets; they never hold
	// mountpoint, canmount, quota, refquota or the plugin's own properties.
	Properties map[string]string
}

// Config is the validated configuration the manager works to.
type Config struct {
	Parent  string
	Classes []Class // sorted by Name
}

// Pool returns the pool that holds the parent dataset.
func (c Config) Pool() string { return zfs.PoolOf(c.Parent) }

// ClassDataset returns the container dataset of a class.
func (c Config) ClassDataset(class string) string { return c.Parent + "/" + class }

// SlotDataset returns the dataset of one slot.
func (c Config) SlotDataset(class string, index int) string {
	return c.ClassDataset(class) + "/" + strconv.Itoa(index)
}

// DeviceID returns the Nomad device instance ID of a slot: "<class>-<index>".
func DeviceID(class string, index int) string { return class + "-" + strconv.Itoa(index) }

// SlotProps returns the properties a new slot dataset of class c is created
// with: the class properties, setuid=off and devices=off unless the class says
// otherwise, the quota as refquota, and the plugin's marks.
func (c Class) SlotProps() map[string]string {
	props := map[string]string{"setuid": "off", "devices": "off"}
	for k, v := range c.Properties {
		props[k] = v
	}
	props["refquota"] = strconv.FormatUint(c.Quota, 10)
	props[PropManaged] = ManagedSlot
	props[PropState] = string(StateFree)
	return props
}

// ActionKind says what an Action does to ZFS.
type ActionKind int

const (
	CreateClass ActionKind = iota // create a class container dataset
	CreateSlot                    // create a fresh slot dataset
	DestroySlot                   // destroy a free slot beyond the count
	SetQuota                      // bring a free slot's refquota to the class quota
)

func (k ActionKind) String() string {
	switch k {
	case CreateClass:
		return "create class dataset"
	case CreateSlot:
		return "create slot"
	case DestroySlot:
		return "destroy surplus free slot"
	case SetQuota:
		return "set refquota"
	}
	return "action " + strconv.Itoa(int(k))
}

// Action is one change Plan asks for.
type Action struct {
	Kind    ActionKind
	Dataset string
	Class   string
	Index   int               // slot index; -1 for class actions
	Props   map[string]string // for creates
	Value   string            // for SetQuota
}

// Plan is what Sync must do to bring ZFS to the configuration.
type Plan struct {
	Actions []Action
	// Foreign lists datasets under the parent that the plugin does not manage
	// (no local PropManaged mark) or no longer configures. They are reported
	// and never touched.
	Foreign []string
}

// MakePlan compares the configuration with the datasets that one
// `zfs get -r -d 2 <parent>` returned and says what to create and destroy.
// It is a pure function; the order of its actions is deterministic.
func MakePlan(cfg Config, datasets []zfs.Dataset) Plan {
	byName := make(map[string]zfs.Dataset, len(datasets))
	for _, d := range datasets {
		byName[d.Name] = d
	}
	var p Plan
	configured := make(map[string]bool, len(cfg.Classes))
	for _, c := range cfg.Classes {
		configured[c.Name] = true
		container := cfg.ClassDataset(c.Name)
		cd, exists := byName[container]
		switch {
		case !exists:
			p.Actions = append(p.Actions, Action{Kind: CreateClass, Dataset: container, Class: c.Name, Index: -1,
				Props: map[string]string{PropManaged: ManagedClass}})
		case !isManaged(cd, ManagedClass):
			// Someone else's dataset sits where our class goes: hands off.
			continue
		}
		for i := 0; i < c.Slots; i++ {
			name := cfg.SlotDataset(c.Name, i)
			d, ok := byName[name]
			if !ok {
				p.Actions = append(p.Actions, Action{Kind: CreateSlot, Dataset: name, Class: c.Name, Index: i, Props: c.SlotProps()})
				continue
			}
			if !isManaged(d, ManagedSlot) || slotState(d) != StateFree {
				continue
			}
			if q, _ := d.Value("refquota"); q != strconv.FormatUint(c.Quota, 10) {
				p.Actions = append(p.Actions, Action{Kind: SetQuota, Dataset: name, Class: c.Name, Index: i,
					Value: strconv.FormatUint(c.Quota, 10)})
			}
		}
	}
	for _, d := range datasets {
		rel, ok := strings.CutPrefix(d.Name, cfg.Parent+"/")
		if !ok {
			continue // the parent itself
		}
		class, idx, nested := strings.Cut(rel, "/")
		if !nested {
			if !configured[class] || !isManaged(d, ManagedClass) {
				p.Foreign = append(p.Foreign, d.Name)
			}
			continue
		}
		if !configured[class] || !isManaged(byName[cfg.ClassDataset(class)], ManagedClass) {
			continue // reported with its container
		}
		index := parseIndex(idx)
		if index < 0 || !isManaged(d, ManagedSlot) {
			p.Foreign = append(p.Foreign, d.Name)
			continue
		}
		if index >= classByName(cfg, class).Slots && slotState(d) == StateFree {
			p.Actions = append(p.Actions, Action{Kind: DestroySlot, Dataset: d.Name, Class: class, Index: index})
		}
	}
	sort.Strings(p.Foreign)
	return p
}

func classByName(cfg Config, name string) Class {
	for _, c := range cfg.Classes {
		if c.Name == name {
			return c
		}
	}
	return Class{}
}

func isManaged(d zfs.Dataset, kind string) bool {
	v, ok := d.Local(PropManaged)
	return ok && v == kind
}

// slotState returns the recorded state of a slot, or "" when none is set.
func slotState(d zfs.Dataset) State {
	v, _ := d.Local(PropState)
	return State(v)
}

// parseIndex returns the slot index that a dataset's last name component
// spells ("0", "17"; not "007" or "-1"), or -1.
func parseIndex(comp string) int {
	n, err := strconv.Atoi(comp)
	if err != nil || n < 0 || strconv.Itoa(n) != comp {
		return -1
	}
	return n
}
