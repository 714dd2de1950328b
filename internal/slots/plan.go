// Package slots holds the slot state machine: for each configured class, the
// datasets <parent>/<class>/<index> that the plugin offers as device
// instances. It adopts what exists, creates what is missing, destroys free
// slots beyond the configured count, and records reservations. All durable
// state lives in ZFS user properties on the datasets themselves, never in a
// side file, so the plugin can be killed at any point and start again from
// what ZFS says.
package slots

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// User properties the plugin sets. Only datasets that carry PropManaged with
// source "local" are ever changed by the plugin.
const (
	// PropManaged marks a dataset as the plugin's own: ManagedSlot on slot
	// datasets, ManagedClass on the per-class container datasets.
	PropManaged = "nomad-device-zfs:managed"
	// PropState records a slot's state (see State).
	PropState = "nomad-device-zfs:state"
	// The owner of a reserved slot, stamped after Reserve, and the time its
	// release began. They stay on the dataset in the archive.
	PropAllocID    = "nomad-device-zfs:alloc-id"
	PropAllocName  = "nomad-device-zfs:alloc-name"
	PropNamespace  = "nomad-device-zfs:namespace"
	PropJob        = "nomad-device-zfs:job"
	PropGroup      = "nomad-device-zfs:group"
	PropTask       = "nomad-device-zfs:task"
	PropNodeID     = "nomad-device-zfs:node-id"
	PropReleasedAt = "nomad-device-zfs:released-at"

	ManagedSlot    = "slot"
	ManagedClass   = "class"
	ManagedArchive = "archive"

	// ArchiveName is the container of released datasets, under the parent.
	// Class names cannot start with '.', so it never collides with one.
	ArchiveName = ".archive"
)

// OnRelease values: what happens to a dataset once its allocation is over.
const (
	OnReleaseArchive = "archive"
	OnReleaseDestroy = "destroy"
)

// State is the durable state of a slot, stored in PropState.
type State string

const (
	// StateFree: an empty dataset waiting for a task.
	StateFree State = "free"
	// StateReserved: Nomad has called Reserve for it.
	StateReserved State = "reserved"
	// StateReleasing: its allocation is over; it is on its way to the
	// archive. StateDestroying: the same, to be destroyed once there.
	StateReleasing  State = "releasing"
	StateDestroying State = "destroying"
	// StateArchived: released and kept under <parent>/.archive.
	StateArchived State = "archived"
)

// ownerProps are the user properties that identify a slot's owner, in the
// order they are stamped.
var ownerProps = []string{PropAllocID, PropNamespace, PropJob, PropGroup, PropTask, PropAllocName, PropNodeID}

// Owner identifies the allocation and task that hold a slot, and the Nomad
// node the allocation was seen on.
type Owner struct {
	AllocID, Namespace, Job, Group, Task, AllocName, NodeID string
}

// Known reports whether the owner's allocation is known.
func (o Owner) Known() bool { return o.AllocID != "" }

func (o Owner) values() []string {
	return []string{o.AllocID, o.Namespace, o.Job, o.Group, o.Task, o.AllocName, o.NodeID}
}

// String is a short description for logs and health texts.
func (o Owner) String() string {
	if !o.Known() {
		return "an unknown allocation"
	}
	id := o.AllocID
	if len(id) > 8 {
		id = id[:8]
	}
	return fmt.Sprintf("allocation %s (%s/%s, group %s, task %s)", id, o.Namespace, o.Job, o.Group, o.Task)
}

func ownerOf(d zfs.Dataset) Owner {
	var v [7]string
	for i, p := range ownerProps {
		v[i], _ = d.Local(p)
	}
	return Owner{AllocID: v[0], Namespace: v[1], Job: v[2], Group: v[3], Task: v[4], AllocName: v[5], NodeID: v[6]}
}

// ObservedProps are the properties read by the one batched `zfs get` of every
// refresh, in the order they are asked for.
var ObservedProps = []string{
	"mounted", "mountpoint", "canmount", "used", "available", "referenced", "compressratio",
	"refquota", PropManaged, PropState, PropAllocID, PropNamespace, PropJob, PropGroup,
	PropTask, PropAllocName, PropNodeID, PropReleasedAt,
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
	// OnRelease is OnReleaseArchive or OnReleaseDestroy.
	OnRelease string
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

// ArchiveDataset returns the container of released datasets.
func (c Config) ArchiveDataset() string { return c.Parent + "/" + ArchiveName }

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
	CreateClass     ActionKind = iota // create a class container dataset
	CreateSlot                        // create a fresh slot dataset
	DestroySlot                       // destroy a free slot beyond the count
	SetQuota                          // bring a free slot's refquota to the class quota
	CreateArchive                     // create the .archive container
	SetProp                           // set one property (release bookkeeping)
	Unmount                           // unmount a slot being released
	RenameToArchive                   // move a slot being released into the archive
	DestroyArchived                   // destroy a released dataset (on_release = "destroy")
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
	case CreateArchive:
		return "create archive dataset"
	case SetProp:
		return "set property"
	case Unmount:
		return "unmount released slot"
	case RenameToArchive:
		return "move released slot to the archive"
	case DestroyArchived:
		return "destroy released dataset"
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
	Prop    string            // for SetProp
	Value   string            // for SetQuota and SetProp
	Target  string            // for RenameToArchive
	// Chain groups the steps of one release: when one fails, the later
	// steps of the same chain are skipped until the next Sync.
	Chain string
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
// `zfs get -r -d 2 <parent>` returned and says what to create, release and
// destroy. now stamps releases that have no release time yet. It is a pure
// function; the order of its actions is deterministic.
//
// A slot whose state is releasing or destroying gets the remaining steps of
// its release, each decided from what ZFS says: record the release time,
// canmount=noauto, unmount, rename into <parent>/.archive, then a fresh
// dataset in its place. A dataset in the archive still marked releasing is
// marked archived; one marked destroying is destroyed. So a release
// interrupted at any point is finished by the next plan.
func MakePlan(cfg Config, datasets []zfs.Dataset, now time.Time) Plan {
	byName := make(map[string]zfs.Dataset, len(datasets))
	for _, d := range datasets {
		byName[d.Name] = d
	}
	var p Plan
	archive := cfg.ArchiveDataset()
	ad, archiveExists := byName[archive]
	archiveOK := archiveExists && isManaged(ad, ManagedArchive)
	if !archiveExists {
		p.Actions = append(p.Actions, Action{Kind: CreateArchive, Dataset: archive, Index: -1,
			Props: map[string]string{PropManaged: ManagedArchive, "canmount": "off"}})
		archiveOK = true
	}
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
		first, rest, nested := strings.Cut(rel, "/")
		if first == ArchiveName {
			if nested && archiveOK && isManaged(d, ManagedSlot) {
				p.Actions = append(p.Actions, finishArchived(d)...)
			} else if !nested && !archiveOK {
				p.Foreign = append(p.Foreign, d.Name)
			}
			continue
		}
		if !nested {
			if !configured[first] || !isManaged(d, ManagedClass) {
				p.Foreign = append(p.Foreign, d.Name)
			}
			continue
		}
		if !configured[first] || !isManaged(byName[cfg.ClassDataset(first)], ManagedClass) {
			continue // reported with its container
		}
		index := parseIndex(rest)
		if index < 0 || !isManaged(d, ManagedSlot) {
			p.Foreign = append(p.Foreign, d.Name)
			continue
		}
		c := classByName(cfg, first)
		switch st := slotState(d); {
		case st == StateReleasing || st == StateDestroying:
			if archiveOK {
				p.Actions = append(p.Actions, releaseSteps(cfg, c, index, d, now)...)
			}
		case index >= c.Slots && st == StateFree:
			p.Actions = append(p.Actions, Action{Kind: DestroySlot, Dataset: d.Name, Class: first, Index: index})
		}
	}
	sort.Strings(p.Foreign)
	return p
}

// releaseSteps returns what is left of the release of slot d.
func releaseSteps(cfg Config, c Class, index int, d zfs.Dataset, now time.Time) []Action {
	var steps []Action
	add := func(a Action) {
		a.Dataset, a.Class, a.Index, a.Chain = d.Name, c.Name, index, d.Name
		steps = append(steps, a)
	}
	releasedAt, ok := d.Local(PropReleasedAt)
	if _, err := time.Parse(time.RFC3339, releasedAt); !ok || err != nil {
		releasedAt = now.UTC().Format(time.RFC3339)
		add(Action{Kind: SetProp, Prop: PropReleasedAt, Value: releasedAt})
	}
	if v, _ := d.Value("canmount"); v != "noauto" {
		add(Action{Kind: SetProp, Prop: "canmount", Value: "noauto"})
	}
	if v, _ := d.Value("mounted"); v == "yes" {
		add(Action{Kind: Unmount})
	}
	at, _ := time.Parse(time.RFC3339, releasedAt)
	add(Action{Kind: RenameToArchive, Target: cfg.ArchiveDataset() + "/" + ArchiveLeaf(c.Name, index, ownerOf(d), at)})
	if index < c.Slots {
		steps = append(steps, Action{Kind: CreateSlot, Dataset: d.Name, Class: c.Name, Index: index, Props: c.SlotProps(), Chain: d.Name})
	}
	return steps
}

// finishArchived returns what is left to do for a dataset in the archive.
func finishArchived(d zfs.Dataset) []Action {
	switch slotState(d) {
	case StateReleasing:
		return []Action{{Kind: SetProp, Dataset: d.Name, Index: -1, Prop: PropState, Value: string(StateArchived), Chain: d.Name}}
	case StateDestroying:
		return []Action{{Kind: DestroyArchived, Dataset: d.Name, Index: -1, Chain: d.Name}}
	}
	return nil
}

// ArchiveLeaf names a released dataset so that an operator can tell where it
// came from: class, slot, namespace, job, group, task, allocation (short ID)
// and release time, e.g.
// "scratch-0.default.web.app.server.1a2b3c4d.20261121T143000Z".
// The full identity is kept in user properties as well.
func ArchiveLeaf(class string, index int, o Owner, releasedAt time.Time) string {
	id := o.AllocID
	if len(id) > 8 {
		id = id[:8]
	}
	parts := []string{DeviceID(class, index), o.Namespace, o.Job, o.Group, o.Task, id, releasedAt.UTC().Format("20060102T150405Z")}
	for i, part := range parts {
		parts[i] = sanitize(part, 40)
	}
	return strings.Join(parts, ".")
}

// sanitize keeps the characters zfs allows in a name component, replaces
// the rest with '_', and cuts to max bytes. An empty part becomes "_".
func sanitize(s string, max int) string {
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == ':'
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) > max {
		b = b[:max]
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
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
