// Package durable writes files whole: to a temporary name in the target's
// directory, fsynced, renamed, and the directory fsynced, so that a crash
// leaves either the old file or the complete new one, never a part.
// The plugin's key files (package record) and backup streams (package
// backup) are written through it.
package durable

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ErrNotDurable: a directory's fsync failed, so the entries made in it are
// not known to be on disk.
var ErrNotDurable = errors.New("not known to be on disk")

// WriteFile writes path with what fill writes, mode perm. On a nil error
// the file is complete, fsynced, and its directory entry too. An error
// before the rename leaves nothing new behind (the temporary file is
// removed) and a file already at path unchanged; an error from the
// directory's fsync comes after the rename: the new file is at path, and
// not known to be on disk (errors.Is(err, ErrNotDurable)), which a caller
// that must not leave it there removes.
func WriteFile(path string, perm os.FileMode, fill func(w io.Writer) error) error {
	dir := filepath.Dir(path)
	tmp, err := tempFile(dir, perm)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	// The mode is set again after the create: the umask may have cleared
	// bits of perm.
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := fill(tmp); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, so that the entries made, renamed or
// removed in it are on disk.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w: %w", dir, ErrNotDurable, err)
	}
	return nil
}

// tempFile creates a new file with a random name starting ".tmp-" in dir.
func tempFile(dir string, perm os.FileMode) (*os.File, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(dir, ".tmp-"+hex.EncodeToString(b[:])), os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
}
