package record

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// PropOwner records, in one user property, the allocation and task that a
// slot was handed to. Its value is URL query encoding (keys sorted), so that
// what a job submitter chose (job, group and task names, namespaces) is data
// and never structure: no TAB, newline or other control character reaches
// ZFS, and every field is bounded (MaxOwnerField bytes before encoding).
// One property costs one `zfs set` on every ZFS.
const PropOwner = "nomad-device-zfs:owner"

// MaxOwnerField bounds each field of an owner before it is encoded. Nomad's
// own IDs are 36 bytes; names longer than this are cut (matching uses the
// allocation ID only).
const MaxOwnerField = 256

// LegacyOwnerProps are the one-property-per-field owner marks that earlier
// versions wrote. They are read (never written) so that datasets reserved or
// archived by an earlier version keep their owner.
var LegacyOwnerProps = []string{
	"nomad-device-zfs:alloc-id", "nomad-device-zfs:namespace", "nomad-device-zfs:job",
	"nomad-device-zfs:group", "nomad-device-zfs:task", "nomad-device-zfs:alloc-name",
	"nomad-device-zfs:node-id",
}

// Owner identifies the allocation and task that hold a slot, and the Nomad
// node the allocation was seen on. Parent is the job that launched Job when
// Job is a periodic or dispatched child ("" otherwise): the children of one
// parent are one identity (IdentityJob).
type Owner struct {
	AllocID, Namespace, Job, Group, Task, AllocName, NodeID string
	Parent                                                  string
}

// IdentityJob is the job that owner o's data belongs to: the parent of a
// periodic or dispatched child (each run is a new job, "batch/periodic-
// 1733400000", whose data is its parent's), otherwise the job itself.
func (o Owner) IdentityJob() string {
	if o.Parent != "" {
		return o.Parent
	}
	return o.Job
}

// Known reports whether the owner's allocation is known.
func (o Owner) Known() bool { return o.AllocID != "" }

// String is a short description for logs and health texts. Names are quoted
// so that control characters in them are shown escaped.
func (o Owner) String() string {
	if !o.Known() {
		return "an unknown allocation"
	}
	return fmt.Sprintf("allocation %s (%q/%q, group %q, task %q)", ShortID(o.AllocID), o.Namespace, o.Job, o.Group, o.Task)
}

// Encode returns the value of PropOwner for o.
func (o Owner) Encode() string {
	v := url.Values{}
	for _, f := range []struct{ k, v string }{
		{"alloc", o.AllocID}, {"ns", o.Namespace}, {"job", o.Job}, {"group", o.Group},
		{"task", o.Task}, {"name", o.AllocName}, {"node", o.NodeID}, {"parent", o.Parent},
	} {
		if f.v != "" {
			v.Set(f.k, bound(f.v))
		}
	}
	return v.Encode()
}

// DecodeOwner parses a PropOwner value. Unknown keys are ignored (a newer
// version may add some); a value that is not query encoding is an error.
func DecodeOwner(s string) (Owner, error) {
	q, err := url.ParseQuery(s)
	if err != nil {
		return Owner{}, fmt.Errorf("%s: %w", PropOwner, err)
	}
	return Owner{AllocID: q.Get("alloc"), Namespace: q.Get("ns"), Job: q.Get("job"), Group: q.Get("group"),
		Task: q.Get("task"), AllocName: q.Get("name"), NodeID: q.Get("node"), Parent: q.Get("parent")}, nil
}

func bound(s string) string {
	if len(s) > MaxOwnerField {
		return s[:MaxOwnerField]
	}
	return s
}

// RecordedOwner returns the owner recorded on d (read with OwnerProps):
// PropOwner, else the legacy properties of earlier versions; a zero Owner
// when none is recorded. A PropOwner that does not decode is an error: the
// owner is then unknown, never guessed.
func RecordedOwner(d zfs.Dataset) (Owner, error) {
	if v, ok := d.Local(PropOwner); ok {
		return DecodeOwner(v)
	}
	var v [7]string
	for i, p := range LegacyOwnerProps {
		v[i], _ = d.Local(p)
	}
	return Owner{AllocID: v[0], Namespace: v[1], Job: v[2], Group: v[3], Task: v[4], AllocName: v[5], NodeID: v[6]}, nil
}

// OwnerProps are the properties RecordedOwner reads: PropOwner, then the
// legacy ones of earlier versions.
var OwnerProps = append([]string{PropOwner}, LegacyOwnerProps...)

// AllocIndex returns the allocation's index in its group, read from its
// name ("job.group[3]" → 3), or -1 when the name does not end in one.
func (o Owner) AllocIndex() int {
	name, ok := strings.CutSuffix(o.AllocName, "]")
	if !ok {
		return -1
	}
	i := strings.LastIndexByte(name, '[')
	if i < 0 {
		return -1
	}
	return ParseIndex(name[i+1:])
}

// SameIdentity reports whether a and b are the same task of the same
// allocation slot of a job: namespace, job (IdentityJob: the parent of a
// periodic or dispatched child), group, task and allocation index, all
// known. A replacement allocation (a job update, a reschedule, a stop and
// run, the next run of a periodic job) has its predecessor's identity.
func SameIdentity(a, b Owner) bool {
	if a.Truncated() || b.Truncated() {
		return false // a cut name could be another's: no proof
	}
	return a.Known() && b.Known() && a.AllocIndex() >= 0 && a.AllocIndex() == b.AllocIndex() &&
		a.Namespace == b.Namespace && a.IdentityJob() == b.IdentityJob() && a.Group == b.Group && a.Task == b.Task
}

// Bounded returns o as PropOwner records it: each field cut to
// MaxOwnerField bytes. Compare what a view says with what ZFS recorded
// through it.
func (o Owner) Bounded() Owner {
	return Owner{AllocID: bound(o.AllocID), Namespace: bound(o.Namespace), Job: bound(o.Job), Group: bound(o.Group),
		Task: bound(o.Task), AllocName: bound(o.AllocName), NodeID: bound(o.NodeID), Parent: bound(o.Parent)}
}

// Truncated reports whether a field of o may have been cut to
// MaxOwnerField bytes when recorded (it is that long or longer): two such
// owners could be of different identities, so none is taken for another.
func (o Owner) Truncated() bool {
	for _, f := range []string{o.Namespace, o.Job, o.Group, o.Task, o.AllocName, o.Parent} {
		if len(f) >= MaxOwnerField {
			return true
		}
	}
	return false
}
