package record

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/durable"
)

// Per-slot encryption (slots.Class.Encrypted): each fresh dataset of an
// encrypted class is created with encryption=on, keyformat=raw and its own
// random 32-byte key in a file of the key directory (key_dir), named by a random key ID
// that the dataset records (PropKeyID) and points to (keylocation), so the
// key follows the dataset through renames (archive, restore). The key file
// is written and fsynced before the dataset is created, and removed after
// the dataset is destroyed: what is left on the pool's disks cannot be
// read without it (crypto-erasure).

// PropKeyID is the key ID of an encrypted slot dataset: its key is
// KeyPath(dir, id).
const PropKeyID = "nomad-device-zfs:key-id"

// KeyLen is the length of a raw key, in bytes (what keyformat=raw wants).
const KeyLen = 32

var keyIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ValidKeyID reports whether id is a key ID the plugin makes: 32 hex
// digits, so that a recorded ID can never name a path outside the key
// directory.
func ValidKeyID(id string) bool { return keyIDRE.MatchString(id) }

// KeyPath returns the key file of key ID id in dir.
func KeyPath(dir, id string) string { return filepath.Join(dir, id+".key") }

// KeyLocation is the keylocation property for the key file of id.
func KeyLocation(dir, id string) string { return "file://" + KeyPath(dir, id) }

// EncryptionProps are the properties an encrypted dataset with key id is
// created with.
func EncryptionProps(dir, id string) map[string]string {
	return map[string]string{"encryption": "on", "keyformat": "raw", "keylocation": KeyLocation(dir, id), PropKeyID: id}
}

// NewKey makes a random key in dir (which must exist) and returns its ID.
// On a nil error the key file is complete, mode 0600, and fsynced, and so
// is the directory entry.
func NewKey(dir string) (string, error) {
	var idb [16]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", fmt.Errorf("making a key ID: %w", err)
	}
	id := hex.EncodeToString(idb[:])
	key := make([]byte, KeyLen)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("making a key: %w", err)
	}
	if err := WriteKey(dir, id, key); err != nil {
		return "", err
	}
	return id, nil
}

// WriteKey writes key as the key file of id in dir: to a temporary name,
// mode 0600, fsynced, renamed, and the directory fsynced. On a nil error
// the file is whole; on an error nothing is left behind.
func WriteKey(dir, id string, key []byte) error {
	if !ValidKeyID(id) {
		return fmt.Errorf("writing key: %q is not a key ID the plugin makes", id)
	}
	if len(key) != KeyLen {
		return fmt.Errorf("writing key %s: %d bytes, want %d", id, len(key), KeyLen)
	}
	path := KeyPath(dir, id)
	err := durable.WriteFile(path, 0o600, func(w io.Writer) error {
		_, err := w.Write(key)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing key %s: %w", path, err)
	}
	return nil
}

// RemoveKey removes the key file of id from dir and fsyncs the directory.
// A key that is already gone is not an error; an ID the plugin did not
// make is, and nothing is removed.
func RemoveKey(dir, id string) error {
	if !ValidKeyID(id) {
		return fmt.Errorf("removing key: %q is not a key ID the plugin makes", id)
	}
	if err := os.Remove(KeyPath(dir, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing key: %w", err)
	}
	return durable.SyncDir(dir)
}

// EnsureKeyDir makes dir (mode 0700, root's) when it is missing, and
// refuses one that someone else could read or write: a key there would
// not be the plugin's alone.
func EnsureKeyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s has mode %04o: group and others must have no access (chmod 0700 %s)", dir, fi.Mode().Perm(), dir)
	}
	if uid, ok := ownerUID(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the plugin's (uid %d)", dir, uid, os.Geteuid())
	}
	return nil
}
