package reconcile

// The reconcile plan: what Sync must do to bring ZFS to the configuration,
// decided by a pure function of the configuration and one read (MakePlan)
// and carried out by package slots (through package slots/apply).

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// OnRelease values: what happens to a dataset once its allocation is over.
const (
	OnReleaseArchive = "archive"
	OnReleaseDestroy = "destroy"
)

// ObservedProps are the properties read by the one batched `zfs get` of every
// refresh, in the order they are asked for.
// The legacy owner properties come last: they are read only for datasets
// that an earlier version stamped.
var ObservedProps = append([]string{
	"mounted", "mountpoint", "canmount", "used", "available", "referenced", "compressratio",
	"refquota", "origin", record.PropManaged, record.PropState, record.PropOwner, record.PropReleasedAt, record.PropKeyID,
}, record.LegacyOwnerProps...)

// ActionKind says what an Action does to ZFS.
type ActionKind int

const (
	CreateClass     ActionKind = iota // create a class container dataset
	CreateSlot                        // create a fresh slot dataset (a clone of the class's source, if any)
	DestroySlot                       // destroy a free slot beyond the count, or made from an old source
	SetQuota                          // bring a free slot's refquota to the class quota
	CreateArchive                     // create the .archive container
	SetProp                           // set one property (release bookkeeping)
	MountSlot                         // mount a free slot that is not mounted
	Unmount                           // unmount a slot being released: `zfs set canmount=off`
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
	case MountSlot:
		return "mount free slot"
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
	// KeyID is the key of an encrypted dataset that DestroySlot or
	// DestroyArchived destroys: its key file is removed after it.
	KeyID string
	// CheckSource, on a DestroySlot that makes a free dataset again from
	// the class's source: the snapshot must exist first, or the free
	// dataset is kept. Why says why it is made again.
	CheckSource, Why string
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
	// Unreadable lists datasets whose properties did not parse (a value
	// with control characters written by hand or by an old version): they
	// are reported and never touched, and make only their own slot
	// unhealthy.
	Unreadable []zfs.Dataset
	// ArchiveReady: the archive container exists and is the plugin's, so
	// a release may rename into it.
	ArchiveReady bool
	// ArchiveUnmounted: the archive container's mountpoint is none, so
	// that nothing renamed into it is mounted again (see
	// Config.RenameUnmounts).
	ArchiveUnmounted bool
}

// MakePlan compares the configuration with the datasets that one
// `zfs get -r -d 2 <parent>` returned and says what to create, release and
// destroy. now names the archive of a release that has no release time
// recorded. It is a pure function; the order of its actions is
// deterministic.
//
// Each slot gets one fresh dataset, serving or as the spare beside the
// one in use (see pair.go). A slot dataset whose state is archived,
// releasing or destroying gets the remaining steps of its release, each
// decided from what ZFS says: unmount (canmount=off), rename into
// <parent>/.archive, then a fresh dataset under its name when the slot has
// no other. A dataset in the archive marked destroying is
// destroyed; one still marked releasing (an earlier version's release) is
// marked archived. So a release interrupted at any point is finished by the
// next plan.
func MakePlan(cfg Config, datasets []zfs.Dataset, now time.Time) Plan {
	byName := make(map[string]zfs.Dataset, len(datasets))
	for _, d := range datasets {
		byName[d.Name] = d
	}
	var p Plan
	for _, d := range datasets {
		if d.Err != nil {
			p.Unreadable = append(p.Unreadable, d)
		}
	}
	keys := keyUsers(datasets)
	archive := cfg.ArchiveDataset()
	ad, archiveExists := byName[archive]
	archiveOK := archiveExists && ad.Err == nil && record.IsManaged(ad, record.ManagedArchive)
	p.ArchiveReady = archiveOK
	if mp, _ := ad.Value("mountpoint"); archiveOK && mp == "none" {
		p.ArchiveUnmounted = true
	}
	switch {
	case !archiveExists:
		props := map[string]string{record.PropManaged: record.ManagedArchive, "canmount": "off"}
		if cfg.RenameUnmounts {
			props["mountpoint"] = "none"
		}
		p.Actions = append(p.Actions, Action{Kind: CreateArchive, Dataset: archive, Index: -1, Props: props})
		archiveOK = true
	case archiveOK && cfg.RenameUnmounts && !p.ArchiveUnmounted && !archiveMounted(cfg, datasets):
		// Made by an earlier version, or on a ZFS whose rename does not
		// unmount. Only while none of its datasets is mounted (the plugin
		// leaves them unmounted; an operator may be looking inside), so
		// that this changes no mount and is never refused as busy. From
		// the next read on, a release's rename unmounts.
		p.Actions = append(p.Actions, Action{Kind: SetProp, Dataset: archive, Index: -1, Prop: "mountpoint", Value: "none"})
	}
	configured := make(map[string]bool, len(cfg.Classes))
	// remake: whether a slot dataset being released is made again, fresh,
	// once it is renamed away (pair.plan).
	remake := map[string]bool{}
	for _, c := range cfg.Classes {
		configured[c.Name] = true
		container := cfg.ClassDataset(c.Name)
		cd, exists := byName[container]
		switch {
		case !exists:
			p.Actions = append(p.Actions, Action{Kind: CreateClass, Dataset: container, Class: c.Name, Index: -1,
				Props: map[string]string{record.PropManaged: record.ManagedClass}})
		case cd.Err != nil || !record.IsManaged(cd, record.ManagedClass):
			// Someone else's dataset sits where our class goes, or one we
			// cannot read: hands off.
			continue
		}
		for i := 0; i < c.Slots; i++ {
			pr := PairOf(cfg, c.Name, i, byName)
			create, destroy, again := pr.plan()
			if create != "" {
				p.Actions = append(p.Actions, Action{Kind: CreateSlot, Dataset: create, Class: c.Name, Index: i, Props: c.SlotProps()})
			}
			if destroy != "" {
				p.Actions = append(p.Actions, Action{Kind: DestroySlot, Dataset: destroy, Class: c.Name, Index: i, KeyID: keys.of(byName[destroy])})
			}
			for k, name := range pr.Names {
				remake[name] = again[k]
				if pr.Kinds[k] != NameFresh || name == destroy {
					continue
				}
				d := pr.DS[k]
				if why := staleFresh(c, d); why != "" {
					// Made to another configuration (the class's source
					// or encryption changed): never handed over, so made
					// again. Toward a source, only once it is known to
					// exist (see Action.CheckSource).
					p.Actions = append(p.Actions,
						Action{Kind: DestroySlot, Dataset: name, Class: c.Name, Index: i, Chain: name, KeyID: keys.of(d),
							CheckSource: c.Source, Why: why},
						Action{Kind: CreateSlot, Dataset: name, Class: c.Name, Index: i, Props: c.SlotProps(), Chain: name})
					continue
				}
				if q, _ := d.Value("refquota"); q != strconv.FormatUint(c.Quota, 10) {
					p.Actions = append(p.Actions, Action{Kind: SetQuota, Dataset: name, Class: c.Name, Index: i,
						Value: strconv.FormatUint(c.Quota, 10)})
				}
				// A free slot that is not mounted (an interrupted release,
				// an operator, a crash) is mounted again before it is offered.
				if mounted, _ := d.Value("mounted"); mounted == "no" {
					if cm, _ := d.Value("canmount"); cm == "on" {
						p.Actions = append(p.Actions, Action{Kind: MountSlot, Dataset: name, Class: c.Name, Index: i})
					}
				}
			}
		}
	}
	for _, d := range datasets {
		rel, ok := strings.CutPrefix(d.Name, cfg.Parent+"/")
		if !ok || d.Err != nil {
			continue // the parent itself, or unreadable (reported apart)
		}
		first, rest, nested := strings.Cut(rel, "/")
		if strings.HasPrefix(first, record.ProbePrefix) {
			continue // SetConfig's probe, destroyed by SetConfig
		}
		if first == record.ArchiveName {
			if nested && archiveOK && record.IsManaged(d, record.ManagedSlot) {
				p.Actions = append(p.Actions, finishArchived(d, keys)...)
			} else if !nested && !archiveOK {
				p.Foreign = append(p.Foreign, d.Name)
			}
			continue
		}
		if !nested {
			if !configured[first] || !record.IsManaged(d, record.ManagedClass) {
				p.Foreign = append(p.Foreign, d.Name)
			}
			continue
		}
		if cd := byName[cfg.ClassDataset(first)]; !configured[first] || cd.Err != nil || !record.IsManaged(cd, record.ManagedClass) {
			continue // reported with its container
		}
		index, _ := record.SlotIndex(rest)
		if index < 0 || !record.IsManaged(d, record.ManagedSlot) {
			p.Foreign = append(p.Foreign, d.Name)
			continue
		}
		c := ClassByName(cfg, first)
		switch st := record.Recorded(d); {
		case st == record.StateReleasing || st == record.StateDestroying || st == record.StateArchived:
			if archiveOK {
				p.Actions = append(p.Actions, ReleaseSteps(cfg, c, index, d, now, remake[d.Name], p.ArchiveUnmounted)...)
			}
		case index >= c.Slots && st == record.StateFree:
			p.Actions = append(p.Actions, Action{Kind: DestroySlot, Dataset: d.Name, Class: first, Index: index, KeyID: keys.of(d)})
		}
	}
	sort.Strings(p.Foreign)
	return p
}

// finishArchived returns what is left to do for a dataset in the archive.
func finishArchived(d zfs.Dataset, keys keyUse) []Action {
	switch record.Recorded(d) {
	case record.StateReleasing:
		return []Action{{Kind: SetProp, Dataset: d.Name, Index: -1, Prop: record.PropState, Value: string(record.To(record.Upgrade)), Chain: d.Name}}
	case record.StateDestroying:
		return []Action{{Kind: DestroyArchived, Dataset: d.Name, Index: -1, Chain: d.Name, KeyID: keys.of(d)}}
	}
	return nil
}

// archiveMounted reports whether a dataset in the archive container is
// mounted (an operator looking inside).
func archiveMounted(cfg Config, datasets []zfs.Dataset) bool {
	for _, d := range datasets {
		if v, _ := d.Value("mounted"); v == "yes" && strings.HasPrefix(d.Name, cfg.ArchiveDataset()+"/") {
			return true
		}
	}
	return false
}

// ClassByName returns the class of cfg named name (the zero Class when
// none is).
func ClassByName(cfg Config, name string) Class {
	for _, c := range cfg.Classes {
		if c.Name == name {
			return c
		}
	}
	return Class{}
}

// keyIDOf returns the key ID an encrypted dataset records ("" for none).
func keyIDOf(d zfs.Dataset) string {
	v, _ := d.Local(record.PropKeyID)
	return v
}

// keyUse counts, per key ID, the datasets of one read that record it.
type keyUse map[string]int

func keyUsers(datasets []zfs.Dataset) keyUse {
	k := keyUse{}
	for _, d := range datasets {
		if id := keyIDOf(d); id != "" {
			k[id]++
		}
	}
	return k
}

// of returns the key ID of d when d alone records it ("" otherwise): a
// key that another dataset also names (set by hand, or a copy) is never
// removed with d.
func (k keyUse) of(d zfs.Dataset) string {
	if id := keyIDOf(d); id != "" && k[id] == 1 {
		return id
	}
	return ""
}

// staleFresh says why a free dataset of class c no longer matches the
// class ("" when it does): cloned from another snapshot than the class's
// source (or from one at all, or from none), or encrypted when the class
// is not, or the other way round.
func staleFresh(c Class, d zfs.Dataset) string {
	origin, _ := d.Value("origin")
	if origin != c.Source {
		return fmt.Sprintf("made from %q, the class's source is %q", origin, c.Source)
	}
	if encrypted := keyIDOf(d) != ""; encrypted != c.Encrypted {
		return fmt.Sprintf("encrypted=%v, the class's encryption is %v", encrypted, c.Encrypted)
	}
	return ""
}
