package zfs

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. A failed command returns an *Error whose Unwrap yields one
// of these when the cause is recognised, so callers use errors.Is and never
// look at the text that zfs printed.
var (
	// ErrNotExist: the dataset (or pool) named in the command does not exist.
	ErrNotExist = errors.New("dataset does not exist")
	// ErrExist: the dataset to create exists already.
	ErrExist = errors.New("dataset already exists")
	// ErrBusy: the dataset is in use (a process has it open, or ZFS is still
	// settling after a create or mount). Retried with a bounded backoff.
	ErrBusy = errors.New("dataset is busy")
	// ErrUnavailable: ZFS itself cannot answer: no zfs binary, the zfs-fuse
	// daemon is down, the ZFS kernel modules are not loaded, the command was
	// not run as root, the pool is suspended or faulted.
	ErrUnavailable = errors.New("zfs is unavailable")
	// ErrInvalid: zfs rejected an argument, such as a property value.
	ErrInvalid = errors.New("invalid argument")
	// ErrNoSpace: the pool is out of space, so zfs could not write (a `zfs
	// set` or `zfs create` on a full pool). Freeing space, not retrying,
	// is what helps.
	ErrNoSpace = errors.New("pool is out of space")
	// ErrMalformed: output of zfs that does not have the shape it must have.
	// Dataset.Err matches it for a dataset whose `zfs get` lines could not be
	// parsed cleanly (a property value holding a newline, for example).
	ErrMalformed = errors.New("malformed zfs output")
)

// Error is returned for every failed zfs or zpool command.
type Error struct {
	// Args is the full argument list, command first ("zfs", "get", ...).
	Args []string
	// Stderr is what the command printed on standard error, trimmed.
	Stderr string
	// ExitCode is the process exit code, or -1 when it did not exit normally.
	ExitCode int
	// Kind is one of the sentinels above, or nil when the cause is not known.
	Kind error
	// Err is the underlying Go error (exec failure, context deadline), if any.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(strings.Join(e.Args, " "))
	switch {
	case e.Stderr != "":
		b.WriteString(": ")
		b.WriteString(e.Stderr)
	case e.Err != nil:
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	case e.Kind != nil:
		b.WriteString(": ")
		b.WriteString(e.Kind.Error())
	default:
		fmt.Fprintf(&b, ": exit code %d", e.ExitCode)
	}
	return b.String()
}

// Unwrap lets errors.Is match both the sentinel kind and the Go cause (for
// example context.DeadlineExceeded).
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// classify maps what zfs or zpool printed on standard error to a sentinel.
// This file is the only place in the project that reads zfs error text (see
// also treatedAsDataset). The order matters where one message holds several
// hints: zfs-fuse, given `zfs set a=1 b=2 ds` on a full pool, prints both
// "cannot open 'b=2': invalid dataset name" and "out of space".
func classify(stderr string) error {
	s := strings.ToLower(stderr)
	switch {
	case strings.Contains(s, "out of space"), // zfs set, zfs create (zfs-fuse, OpenZFS)
		strings.Contains(s, "no space left on device"):
		return ErrNoSpace
	case strings.Contains(s, "the zfs modules are not loaded"), // OpenZFS 2.1 without the kernel module
		strings.Contains(s, "must be run as root"): // OpenZFS, not root: "Permission denied the ZFS utilities must be run as root."
		return ErrUnavailable
	case strings.Contains(s, "does not exist"), strings.Contains(s, "no such pool"):
		return ErrNotExist
	case strings.Contains(s, "already exists"):
		return ErrExist
	case strings.Contains(s, "busy"):
		// "dataset is busy", "pool is busy", "target is busy", "Device busy".
		return ErrBusy
	case strings.Contains(s, "connect: "), // zfs-fuse: daemon not reachable
		strings.Contains(s, "failed to initialize the libzfs library"),
		strings.Contains(s, "/dev/zfs"),
		strings.Contains(s, "pool i/o is currently suspended"),
		strings.Contains(s, "i/o error"),
		strings.Contains(s, "input/output error"):
		return ErrUnavailable
	case strings.Contains(s, "invalid"), strings.Contains(s, "bad property"),
		strings.Contains(s, "must be one of"),
		strings.Contains(s, "bad numeric value"),              // refquota=abc (all three)
		strings.Contains(s, "is readonly"),                    // 'used' is readonly
		strings.Contains(s, "size is less than current used"), // refquota below what is used
		strings.Contains(s, "property value too long"),        // OpenZFS, an over-long user property
		strings.Contains(s, "argument list too long"):         // zfs-fuse's answer to the same
		return ErrInvalid
	}
	return nil
}

// treatedAsDataset reports whether zfs, in stderr, complains that it cannot
// open arg as a dataset: what a zfs without multi-property `zfs set`
// (zfs-fuse 0.7) prints for every "k=v" after the first, which it reads as
// a dataset name ("cannot open 'k=v': invalid dataset name").
func treatedAsDataset(stderr, arg string) bool {
	return strings.Contains(stderr, "cannot open '"+arg+"'")
}
