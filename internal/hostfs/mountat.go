package hostfs

import (
	"bytes"
	"io"
)

// ParseMountInfoAt is ParseMountInfo for the mounts whose mount point is
// path only. It is a pure function. Every other line is checked for a
// mount point (its fifth field) and skipped unparsed, so that a check of
// one mount costs a scan of the table, not a parse of it: a node's table
// holds a few mounts per allocation (a task's secrets, its directories,
// its chroot), some 300 lines under the churn of `make bench`, and every
// Reserve checks its slot's mount (BenchmarkParseMountInfoAt: a fifth of
// a full parse's time on 230 lines). The lines at path are parsed, and
// refused, as ParseMountInfo does, so that At(path) on the result is
// At(path) on the whole table: only mounts at path can cover one another
// there. A skipped line is refused only when it has no mount point
// field (fewer than six fields) or a malformed escape in it; any other
// fault in it (a bad ID, no separator) goes unseen, where ParseMountInfo
// refuses the table: the kernel writes no such line, and none could
// change what is mounted at path.
func ParseMountInfoAt(r io.Reader, path string) (Table, error) {
	return parseTable(r, func(line []byte) (bool, string) {
		mp, ok := mountPointField(line)
		if !ok {
			return false, "fewer than 6 fields"
		}
		at, reason := mountPointIs(mp, path)
		if reason != "" {
			return false, "mount point: " + reason
		}
		return at, ""
	})
}

// mountPointField returns line's mount point field, its fifth; ok is
// false when line does not have it and a field after it (a mountinfo
// line has at least ten).
func mountPointField(line []byte) (field []byte, ok bool) {
	for range 4 {
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 {
			return nil, false
		}
		line = line[sp+1:]
	}
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return nil, false
	}
	return line[:sp], true
}

// mountPointIs reports whether the escaped mount point field mp is path,
// or why mp is malformed.
func mountPointIs(mp []byte, path string) (bool, string) {
	if bytes.IndexByte(mp, '\\') < 0 {
		return string(mp) == path, ""
	}
	u, reason := unescape(string(mp))
	return u == path, reason
}

// ReadTableAt reads MountInfoPath once, as ReadTable does, and returns the
// mounts whose mount point is path (ParseMountInfoAt).
func ReadTableAt(path string) (Table, error) {
	return readTable(func(r io.Reader) (Table, error) { return ParseMountInfoAt(r, path) })
}
