package backup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// An encrypted archive is sent raw (ciphertext, no key in the stream);
// its key travels beside its manifests, in the identity's directory of
// backup_dir (mode 0600, like the keys in key_dir), so that another node
// can open what it receives. Whoever can read backup_dir can therefore
// read the backups of encrypted classes: keep it as private as key_dir.

// readKey reads a key file and checks its length.
func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) != record.KeyLen {
		return nil, fmt.Errorf("key %s holds %d bytes, want %d", path, len(b), record.KeyLen)
	}
	return b, nil
}

// saveKey copies the key of keyID from keyDir into the identity's
// directory of dir, unless it is there already with the same bytes.
// written reports whether it wrote the file.
func saveKey(keyDir, dir string, id retention.Identity, keyID string) (written bool, err error) {
	if keyDir == "" {
		return false, fmt.Errorf("an encrypted archive, and no key_dir")
	}
	key, err := readKey(record.KeyPath(keyDir, keyID))
	if err != nil {
		return false, fmt.Errorf("reading the archive's key: %w", err)
	}
	idDir := IdentityDir(dir, id)
	if err := os.MkdirAll(idDir, 0o700); err != nil {
		return false, fmt.Errorf("backup_dir: %w", err)
	}
	_, statErr := os.Stat(record.KeyPath(idDir, keyID))
	if err := placeKey(idDir, keyID, key); err != nil {
		return false, err
	}
	return errors.Is(statErr, fs.ErrNotExist), nil
}

// installKey copies the key of keyID from the identity's directory of dir
// into keyDir, for a raw receive. installed reports whether it wrote the
// file (so that a failed receive removes it).
func installKey(dir string, id retention.Identity, keyDir, keyID string) (installed bool, err error) {
	if keyDir == "" {
		return false, fmt.Errorf("an encrypted backup, and no key_dir")
	}
	key, err := readKey(record.KeyPath(IdentityDir(dir, id), keyID))
	if err != nil {
		return false, fmt.Errorf("reading the backup's key: %w", err)
	}
	_, statErr := os.Stat(record.KeyPath(keyDir, keyID))
	if err := placeKey(keyDir, keyID, key); err != nil {
		return false, err
	}
	return errors.Is(statErr, fs.ErrNotExist), nil
}

// placeKey writes key as keyID's file in dir, or checks that the file
// there holds the same bytes (a different key under one ID is an error:
// nothing is overwritten).
func placeKey(dir, keyID string, key []byte) error {
	if !record.ValidKeyID(keyID) {
		return fmt.Errorf("%q is not a key ID the plugin makes", keyID)
	}
	path := record.KeyPath(dir, keyID)
	have, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(have, key):
		return nil
	case err == nil:
		return fmt.Errorf("key %s exists with other contents: nothing overwritten", path)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return record.WriteKey(dir, keyID, key)
}
