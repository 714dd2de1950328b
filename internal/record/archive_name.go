package record

// The names of released datasets in the archive: made from the owner's
// identity and the release time, shortened to fit ZFS's limit, and read
// back for retention.

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// MaxNameLen is the longest dataset name ZFS accepts, in bytes.
const MaxNameLen = 255

// ArchivedName returns the full name a released dataset is renamed to in
// the archive container archive (<parent>/.archive): <archive>/<ArchiveLeaf>,
// shortened to fit MaxNameLen when the parent and the names are long (see
// ArchiveLeaf).
func ArchivedName(archive string, class string, index int, o Owner, releasedAt time.Time) string {
	prefix := archive + "/"
	return prefix + ArchiveLeaf(class, index, o, releasedAt, MaxNameLen-len(prefix))
}

// ArchiveLeaf names a released dataset so that an operator can tell where it
// came from: class, slot, namespace, job, group, task, allocation (short ID)
// and release time, e.g.
// "scratch-0.default.web.app.server.1a2b3c4d.20261121T143000Z". The full
// identity is kept in PropOwner as well. When the name would be longer than
// max bytes, the namespace, job, group and task are replaced by a short
// hash of the whole name ("scratch-0.h3f9a0c1d2e.1a2b3c4d.20261121T143000Z"),
// which stays unique and fits any parent that SetConfig accepts.
func ArchiveLeaf(class string, index int, o Owner, releasedAt time.Time, max int) string {
	id := ShortID(o.AllocID)
	when := releasedAt.UTC().Format(archiveTimeLayout)
	parts := []string{DeviceID(class, index), o.Namespace, o.Job, o.Group, o.Task, id, when}
	for i, part := range parts {
		parts[i] = sanitize(part, 40)
	}
	leaf := strings.Join(parts, ".")
	if len(leaf) <= max {
		return leaf
	}
	sum := sha256.Sum256([]byte(strings.Join([]string{class, strconv.Itoa(index), o.Namespace, o.Job, o.Group, o.Task, o.AllocID, when}, "\x00")))
	return strings.Join([]string{sanitize(DeviceID(class, index), 40), "h" + hex.EncodeToString(sum[:5]), sanitize(id, 8), when}, ".")
}

// archiveTimeLayout is the release time at the end of an archive leaf.
const archiveTimeLayout = "20060102T150405Z"

// ParseArchiveLeaf reads back what ArchiveLeaf put in a leaf: the class and
// slot index the dataset was released from, and the release time (to the
// second). ok is false for a leaf that ArchiveLeaf did not make: such a
// dataset is never pruned.
func ParseArchiveLeaf(leaf string) (class string, index int, releasedAt time.Time, ok bool) {
	parts := strings.Split(leaf, ".")
	if len(parts) < 2 {
		return "", 0, time.Time{}, false
	}
	dev := parts[0]
	cut := strings.LastIndexByte(dev, '-')
	if cut <= 0 {
		return "", 0, time.Time{}, false
	}
	class, index = dev[:cut], ParseIndex(dev[cut+1:])
	at, err := time.Parse(archiveTimeLayout, parts[len(parts)-1])
	if index < 0 || err != nil {
		return "", 0, time.Time{}, false
	}
	return class, index, at, true
}

// MinArchiveLeafLen is the length of the longest shortened archive leaf
// (a 32-byte class name, a 4-digit index): SetConfig refuses a parent
// too long to hold it.
const MinArchiveLeafLen = 37 + 1 + 11 + 1 + 8 + 1 + 16

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
