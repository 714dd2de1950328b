// Package hostfs reads the host's mount table and makes sure the mounts the
// plugin hands to tasks carry nosuid and nodev.
//
// Why: zfs-fuse accepts `setuid=off` and `devices=off` on a dataset but does
// not pass them to the FUSE mount, so a setuid-root binary written by a root
// task runs as root for any host user, and Nomad's bind mount of the slot
// into the task copies the host mount's (missing) flags. EnsureFlags adds the
// flags with a bind remount, which works on every ZFS (and is a no-op where
// the kernel module already honours the properties).
package hostfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// MountInfoPath is the kernel's mount table for this process's namespace.
const MountInfoPath = "/proc/self/mountinfo"

// Mount is one line of /proc/self/mountinfo (proc(5)). Paths are unescaped.
type Mount struct {
	ID       int    // mount ID (field 1)
	ParentID int    // parent mount ID (field 2)
	Major    uint32 // st_dev major of files on this mount (field 3)
	Minor    uint32 // st_dev minor
	Root     string // the directory of the filesystem that is mounted here (field 4)
	// MountPoint is where the mount is, relative to this process's root.
	MountPoint string
	// Options are the per-mount options: "rw" or "ro", then nosuid, nodev,
	// noexec, noatime, nodiratime, relatime, nosymfollow, idmapped as set.
	Options []string
	// Optional are the propagation tags: shared:N, master:N,
	// propagate_from:N, unbindable.
	Optional     []string
	FSType       string   // e.g. "fuse.zfs", "zfs", "ext4"
	Source       string   // e.g. the dataset name, or "none"
	SuperOptions []string // per-superblock options
}

// HasOption reports whether the per-mount options include name.
func (m Mount) HasOption(name string) bool { return slices.Contains(m.Options, name) }

// Table is a parsed mount table, in the kernel's order.
type Table []Mount

// ParseError is a line of mountinfo that does not have the documented shape.
type ParseError struct {
	Line   int    // 1-based
	Text   string // the line as read
	Reason string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("mountinfo line %d: %s: %q", e.Line, e.Reason, e.Text)
}

// maxLine bounds one mountinfo line; overlayfs lines with long lowerdir
// lists exceed bufio's 64 KiB default.
const maxLine = 4 << 20

// ParseMountInfo parses the text of /proc/<pid>/mountinfo. It is a pure
// function. On success every line became one Mount, in order; any line that
// does not have the documented shape (too few fields, no " - " separator,
// not exactly three fields after it, a bad number or escape) makes it fail
// with a *ParseError naming the line.
func ParseMountInfo(r io.Reader) (Table, error) {
	return parseTable(r, func([]byte) (bool, string) { return true, "" })
}

// parseTable parses the lines of mountinfo text that keep takes, in order.
// keep says whether to parse a line, or why it is malformed: a reason
// fails the parse with a *ParseError naming the line, whatever take says.
func parseTable(r io.Reader, keep func(line []byte) (bool, string)) (Table, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var t Table
	n := 0
	for sc.Scan() {
		n++
		take, reason := keep(sc.Bytes())
		if reason == "" && !take {
			continue
		}
		var m Mount
		if reason == "" {
			m, reason = parseLine(sc.Text())
		}
		if reason != "" {
			return nil, &ParseError{Line: n, Text: sc.Text(), Reason: reason}
		}
		t = append(t, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo after line %d: %w", n, err)
	}
	return t, nil
}

// parseLine returns the Mount of one line, or why the line is malformed.
func parseLine(line string) (Mount, string) {
	// Fields are separated by single spaces; the kernel escapes spaces
	// inside them as \040, so an empty field is still a field.
	f := strings.Split(line, " ")
	if len(f) < 10 {
		return Mount{}, fmt.Sprintf("%d fields, want at least 10", len(f))
	}
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 {
		return Mount{}, "no \" - \" separator after the per-mount options"
	}
	if got := len(f) - sep - 1; got != 3 {
		return Mount{}, fmt.Sprintf("%d fields after the separator, want 3 (type, source, super options)", got)
	}
	var m Mount
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil || m.ID < 0 {
		return Mount{}, fmt.Sprintf("bad mount ID %q", f[0])
	}
	if m.ParentID, err = strconv.Atoi(f[1]); err != nil || m.ParentID < 0 {
		return Mount{}, fmt.Sprintf("bad parent ID %q", f[1])
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return Mount{}, fmt.Sprintf("bad major:minor %q", f[2])
	}
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if err1 != nil || err2 != nil {
		return Mount{}, fmt.Sprintf("bad major:minor %q", f[2])
	}
	m.Major, m.Minor = uint32(ma), uint32(mi)

	var reason string
	if m.Root, reason = unescape(f[3]); reason != "" {
		return Mount{}, "root: " + reason
	}
	if m.MountPoint, reason = unescape(f[4]); reason != "" {
		return Mount{}, "mount point: " + reason
	}
	if !strings.HasPrefix(m.MountPoint, "/") {
		return Mount{}, fmt.Sprintf("mount point %q is not absolute", m.MountPoint)
	}
	if f[5] == "" {
		return Mount{}, "empty per-mount options"
	}
	m.Options = strings.Split(f[5], ",")
	if sep > 6 {
		m.Optional = slices.Clone(f[6:sep])
	}
	if m.FSType, reason = unescape(f[sep+1]); reason != "" {
		return Mount{}, "fs type: " + reason
	}
	if m.FSType == "" {
		return Mount{}, "empty fs type"
	}
	if m.Source, reason = unescape(f[sep+2]); reason != "" {
		return Mount{}, "source: " + reason
	}
	if f[sep+3] != "" {
		// Split before unescaping: a comma inside a value is escaped.
		for _, o := range strings.Split(f[sep+3], ",") {
			u, reason := unescape(o)
			if reason != "" {
				return Mount{}, "super options: " + reason
			}
			m.SuperOptions = append(m.SuperOptions, u)
		}
	}
	return m, ""
}

// unescape undoes the kernel's octal escapes (\040 space, \011 tab, \012
// newline, \134 backslash, \043 '#', \054 ','). A backslash not followed by
// three octal digits is malformed: the kernel never writes one.
func unescape(s string) (string, string) {
	if !strings.Contains(s, `\`) {
		return s, ""
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+3 >= len(s) {
			return "", fmt.Sprintf("truncated escape in %q", s)
		}
		v := 0
		for _, c := range []byte(s[i+1 : i+4]) {
			if c < '0' || c > '7' {
				return "", fmt.Sprintf("bad escape in %q", s)
			}
			v = v*8 + int(c-'0')
		}
		if v > 0xff {
			return "", fmt.Sprintf("bad escape in %q", s)
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), ""
}

// ReadTable reads and parses MountInfoPath once. Reading it does not reach
// into any filesystem (FUSE included), so it cannot hang on a stuck daemon.
// Callers read it once per pass and look every slot up in the result.
func ReadTable() (Table, error) { return readTable(ParseMountInfo) }

// readTable reads MountInfoPath once and parses it with parse (ReadTable,
// ReadTableAt), naming the file in a parse error.
func readTable(parse func(io.Reader) (Table, error)) (Table, error) {
	b, err := os.ReadFile(MountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("reading mount table: %w", err)
	}
	t, err := parse(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", MountInfoPath, err)
	}
	return t, nil
}

// Of returns the mounts whose source is source (for ZFS, a dataset's
// name), in the table's order; none when it is mounted nowhere.
func (t Table) Of(source string) []Mount {
	var out []Mount
	for _, m := range t {
		if m.Source == source {
			out = append(out, m)
		}
	}
	return out
}

// At returns the mount whose mount point is exactly path (compared as
// written; pass a clean absolute path). When several are stacked there, it
// returns the visible one: the one no other mount at path sits on, or the
// last listed when that does not decide. ok is false when nothing is mounted
// at path (a directory inside a mount is not a mount point).
func (t Table) At(path string) (m Mount, ok bool) {
	var at []int
	for i := range t {
		if t[i].MountPoint == path {
			at = append(at, i)
		}
	}
	if len(at) == 0 {
		return Mount{}, false
	}
	visible := at[len(at)-1]
	for _, i := range slices.Backward(at) {
		covered := false
		for _, j := range at {
			if j != i && t[j].ParentID == t[i].ID {
				covered = true
				break
			}
		}
		if !covered {
			visible = i
			break
		}
	}
	return t[visible], true
}
