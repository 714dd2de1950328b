// Package retention keeps the archive of released datasets
// (<parent>/.archive) within the operator's policy: per identity the newest
// `keep` archives, none older than `max_age`, and the whole archive under
// `archive_quota`. Plan decides from one read of ZFS and is a pure
// function; Pruner reads, plans and destroys, in batches, outside every
// slot's lock. Nothing outside the archive container is ever destroyed,
// and there only datasets that carry the plugin's marks and an archive
// name the plugin made.
package retention

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// Identity is what makes archives the data of the same task: the
// allocation's namespace, job (the parent job of a periodic or dispatched
// child: record.Owner.IdentityJob), group and task, its index in the group
// (job.group[N]) and the class. Archives whose owner is unknown are
// grouped by the slot they came from instead (Unknown, Slot).
type Identity struct {
	Namespace string `json:"namespace,omitempty"`
	Job       string `json:"job,omitempty"`
	Group     string `json:"group,omitempty"`
	Task      string `json:"task,omitempty"`
	// Index is the allocation's index in its group; -1 when its name
	// does not say.
	Index int    `json:"index"`
	Class string `json:"class"`
	// Unknown: the owner was not recorded (or did not decode); Slot is
	// then the index of the slot the archive came from.
	Unknown bool `json:"unknown,omitempty"`
	Slot    int  `json:"slot,omitempty"`
}

// IdentityOf returns the identity of owner o's data in class, as the
// owner is recorded (each field bounded: see slots.Owner.Bounded).
func IdentityOf(class string, o record.Owner) Identity {
	b := o.Bounded()
	return Identity{Namespace: b.Namespace, Job: b.IdentityJob(), Group: b.Group, Task: b.Task, Index: b.AllocIndex(), Class: class}
}

// String is the identity for logs and tables: "ns/job/group[N]/task
// (class)", names quoted when they hold anything unusual.
func (id Identity) String() string {
	if id.Unknown {
		return fmt.Sprintf("owner unknown, slot %s-%d", id.Class, id.Slot)
	}
	idx := "?"
	if id.Index >= 0 {
		idx = strconv.Itoa(id.Index)
	}
	return fmt.Sprintf("%s/%s/%s[%s]/%s (%s)", show(id.Namespace), show(id.Job), show(id.Group), idx, show(id.Task), id.Class)
}

// show quotes a name that is empty or holds characters beyond the plain
// ones, so that nothing a job submitter chose can break a line.
func show(s string) string {
	for _, r := range s {
		if r < 0x21 || r == 0x7f || r == '/' || r == '"' || r > 0x7e {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// Archive is one released dataset that the archive keeps.
type Archive struct {
	// Name is the full dataset name, <parent>/.archive/<leaf>.
	Name string `json:"name"`
	// Class and Slot are where it was released from.
	Class    string       `json:"class"`
	Slot     int          `json:"slot"`
	Owner    record.Owner `json:"-"`
	AllocID  string       `json:"alloc_id,omitempty"`
	Identity Identity     `json:"identity"`
	// ReleasedAt is when its release began, to the second.
	ReleasedAt time.Time `json:"released_at"`
	// UsedBytes is the space it takes (ZFS's used).
	UsedBytes uint64 `json:"used_bytes"`
	// Backup is the GUID of its snapshot in backup_dir ("" for none).
	Backup string `json:"backup,omitempty"`
	// KeyID is its key's ID when it is encrypted ("" for none): pruning
	// removes the key file after the dataset.
	KeyID string `json:"-"`
	// From is the lineage of its data (record.PropDataFrom): the
	// allocations it was restored from, newest first; nil for none, or
	// for a value that does not parse.
	From record.Lineage `json:"data_from,omitempty"`
}

// Lineage is the lineage of a's data once restored into a slot
// (record.PropDataFrom): its allocation, then its own lineage.
func (a Archive) Lineage() record.Lineage { return a.From.Descend(a.AllocID) }

// Skipped is a dataset in the archive container that retention leaves
// alone, with why.
type Skipped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Container is the archive container as read: what it uses and its quota
// (0 for none).
type Container struct {
	Name       string
	UsedBytes  uint64
	QuotaBytes uint64
	// QuotaMark is the quota the plugin last set (PropArchiveQuota), 0
	// when it set none.
	QuotaMark uint64
	// Exists: the container was in the read.
	Exists bool
}

// PropArchiveQuota records on the archive container the quota the plugin
// set from archive_quota, so that removing archive_quota from the
// configuration removes that quota and never one the operator set.
const PropArchiveQuota = "nomad-device-zfs:archive-quota"

// PropBackup records on an archive the GUID of its snapshot that is in
// backup_dir (see package backup), so that it is sent once.
const PropBackup = record.PropBackup

// Props are the properties Parse needs, in the order Pruner asks for them.
var Props = append([]string{"used", "quota", record.PropManaged, record.PropState, record.PropReleasedAt, PropArchiveQuota, PropBackup, record.PropKeyID, record.PropDataFrom}, record.OwnerProps...)

// Parse sorts one read of the archive container (`zfs get -r -d 1` of
// container, with Props) into the container, the archives retention may
// prune, and what it leaves alone. Archives come back newest first (then by
// name). It is a pure function.
func Parse(container string, ds []zfs.Dataset) (Container, []Archive, []Skipped) {
	c := Container{Name: container}
	var arch []Archive
	var skipped []Skipped
	for _, d := range ds {
		if d.Name == container {
			c.Exists = true
			c.UsedBytes, _ = d.Bytes("used")
			c.QuotaBytes, _ = quotaOf(d)
			if v, ok := d.Local(PropArchiveQuota); ok {
				c.QuotaMark, _ = strconv.ParseUint(v, 10, 64)
			}
			continue
		}
		leaf, ok := strings.CutPrefix(d.Name, container+"/")
		if !ok || leaf == "" || strings.ContainsAny(leaf, "/@") {
			continue // not a child of the container: not ours to judge
		}
		a, why := archiveOf(d, leaf)
		if why != "" {
			skipped = append(skipped, Skipped{Name: d.Name, Reason: why})
			continue
		}
		arch = append(arch, a)
	}
	sortNewestFirst(arch)
	return c, arch, skipped
}

// archiveOf reads one child of the archive container, or says why
// retention leaves it alone.
func archiveOf(d zfs.Dataset, leaf string) (Archive, string) {
	if d.Err != nil {
		return Archive{}, "unreadable: " + d.Err.Error()
	}
	if v, ok := d.Local(record.PropManaged); !ok || v != record.ManagedSlot {
		return Archive{}, "not the plugin's (no local " + record.PropManaged + "=" + record.ManagedSlot + ")"
	}
	if v, _ := d.Local(record.PropState); v != string(record.StateArchived) {
		return Archive{}, fmt.Sprintf("state %q: not a finished archive (a release or destroy in progress is the slot manager's)", v)
	}
	class, slot, at, ok := record.ParseArchiveLeaf(leaf)
	if !ok {
		return Archive{}, "name not made by the plugin: its class, slot and release time cannot be read"
	}
	used, err := d.Bytes("used")
	if err != nil {
		return Archive{}, err.Error()
	}
	a := Archive{Name: d.Name, Class: class, Slot: slot, ReleasedAt: at, UsedBytes: used}
	if v, _ := d.Local(PropBackup); v != record.BackupNone {
		a.Backup = v
	}
	a.KeyID, _ = d.Local(record.PropKeyID)
	a.From = record.RecordedLineage(d)
	o, err := record.RecordedOwner(d)
	if err != nil || !o.Known() {
		a.Identity = Identity{Class: class, Index: -1, Unknown: true, Slot: slot}
		return a, ""
	}
	a.Owner, a.AllocID = o, o.AllocID
	a.Identity = IdentityOf(class, o)
	return a, ""
}

// quotaOf reads a quota: 0 for none ("0" with -p, "none" on some builds).
func quotaOf(d zfs.Dataset) (uint64, error) {
	if v, ok := d.Value("quota"); ok && v == "none" {
		return 0, nil
	}
	return d.Bytes("quota")
}

func sortNewestFirst(a []Archive) {
	sort.SliceStable(a, func(i, j int) bool {
		if !a[i].ReleasedAt.Equal(a[j].ReleasedAt) {
			return a[i].ReleasedAt.After(a[j].ReleasedAt)
		}
		return a[i].Name < a[j].Name
	})
}
