package backup

// An operator's choice between the forks of an identity's data: the
// allocations whose backups are set aside, in a file of the identity's
// directory. A restore never takes their data; backup_dir's retention
// counts them as no kept allocation's.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/durable"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
)

// SetAsideFile is the file of an identity's directory that names, one per
// line, the allocations whose backups are set aside. Lines starting with
// '#' are comments.
const SetAsideFile = "set-aside"

// ErrSetAsideLocal says that a restore found the identity's newest local
// archive to be of an allocation set aside in backup_dir; ErrAllSetAside
// that every backup of the identity is set aside. Both are
// record.ErrDiverged: the operator's choice leaves nothing to restore, and
// the restore waits for them.
var (
	ErrSetAsideLocal = fmt.Errorf("the local archive is of an allocation set aside (%w)", record.ErrDiverged)
	ErrAllSetAside   = fmt.Errorf("every backup is set aside (%w)", record.ErrDiverged)
)

// ErrSetAsideUnreadable says that an identity's SetAsideFile does not
// parse: which backups the operator set aside cannot be known.
var ErrSetAsideUnreadable = errors.New("the set-aside file cannot be read")

// readSetAside returns the allocations set aside in identity directory
// dir: none when the file does not exist. A line that is not an
// allocation ID is an error naming it.
func readSetAside(dir string) (map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, SetAsideFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseSetAside(b)
}

// parseSetAside reads a SetAsideFile's content.
func parseSetAside(b []byte) (map[string]bool, error) {
	out := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if l, err := record.ParseLineage(line); err != nil || len(l) != 1 {
			return nil, fmt.Errorf("%w: %s line %d: %q is not an allocation ID", ErrSetAsideUnreadable, SetAsideFile, n, line)
		}
		out[line] = true
	}
	return out, sc.Err()
}

// identityName is the name of an identity's directory (IdentityDir).
var identityName = regexp.MustCompile("^[0-9a-f]{32}$")

// SetAside sets aside (or, with undo, takes back) the backups of
// allocation alloc in every identity directory of backup_dir dir that
// holds one, and returns those directories' identities' manifests of it
// (newest first). The file is written whole and synced (durable), so that
// a node that reads it reads all of it or the file before. backup_dir
// holding no backup of alloc is an error.
func SetAside(dir, alloc string, undo bool) ([]Manifest, error) {
	return SetAsideIn(dir, alloc, "", undo)
}

// SetAsideIn is SetAside that, when backup_dir holds no backup of alloc
// and identity is given (the name of an identity's directory in
// backup_dir, as a restore waiting for alloc's data names it), writes the
// choice in that identity's directory, made if need be: a restore there
// no longer waits for alloc's data, which never came.
func SetAsideIn(dir, alloc, identity string, undo bool) ([]Manifest, error) {
	if l, err := record.ParseLineage(alloc); err != nil || len(l) != 1 {
		return nil, fmt.Errorf("%q is not an allocation ID", alloc)
	}
	ms, problems, err := List(dir, nil)
	if err != nil {
		return nil, err
	}
	var of []Manifest
	dirs := map[string]bool{}
	for _, m := range ms {
		if m.AllocID == alloc {
			of = append(of, m)
			dirs[filepath.Dir(m.Path())] = true
		}
	}
	if len(of) == 0 && identity != "" {
		if !identityName.MatchString(identity) {
			return nil, fmt.Errorf("-identity %q is not the name of an identity's directory in backup_dir (32 hexadecimal digits)", identity)
		}
		d := filepath.Join(dir, Root, identity)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		if err := setAsideIn(d, alloc, undo); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		return nil, nil
	}
	if len(of) == 0 {
		if len(problems) > 0 {
			return nil, fmt.Errorf("backup_dir %s holds no readable backup of allocation %s (%d unreadable files, %s the first: %s)", dir, alloc, len(problems), problems[0].Path, problems[0].Reason)
		}
		return nil, fmt.Errorf("backup_dir %s holds no backup of allocation %s", dir, alloc)
	}
	keys := make([]string, 0, len(dirs))
	for d := range dirs {
		keys = append(keys, d)
	}
	slices.Sort(keys)
	for _, d := range keys {
		if err := setAsideIn(d, alloc, undo); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
	}
	return of, nil
}

// setAsideIn is SetAside in identity directory d, under an exclusive lock
// of d's lock file (.set-aside.lock, waited for up to SetAsideLockWait), so
// that two operators' choices made at once are both written.
func setAsideIn(d, alloc string, undo bool) error {
	lock, err := os.OpenFile(filepath.Join(d, ".set-aside.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	for deadline := time.Now().Add(SetAsideLockWait); ; {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return fmt.Errorf("locking %s: %w", lock.Name(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	set, err := readSetAside(d)
	if err != nil {
		return err
	}
	if set == nil {
		set = map[string]bool{}
	}
	if set[alloc] != undo {
		return nil // as asked already
	}
	if undo {
		delete(set, alloc)
	} else {
		set[alloc] = true
	}
	ids := make([]string, 0, len(set))
	for a := range set {
		ids = append(ids, a)
	}
	slices.Sort(ids)
	return durable.WriteFile(filepath.Join(d, SetAsideFile), 0o600, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "# allocations whose backups a restore never takes (nomad-device-zfs backups set-aside)\n%s", lines(ids))
		return err
	})
}

// SetAsideLockWait bounds the wait for another operator's set-aside in the
// same identity directory.
const SetAsideLockWait = 10 * time.Second

func lines(ss []string) string {
	var b strings.Builder
	for _, s := range ss {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}

// notSetAside returns the manifests of ms whose allocation is not set
// aside, in ms's order.
func notSetAside(ms []Manifest) []Manifest {
	out := make([]Manifest, 0, len(ms))
	for _, m := range ms {
		if !m.SetAside {
			out = append(out, m)
		}
	}
	return out
}
