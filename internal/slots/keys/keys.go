// Package keys is the keys of a slot engine's encrypted datasets on the
// host: a new key, on disk and fsynced, before the dataset that points to
// it (Create), and its removal once the dataset is destroyed (Remove).
// The key files' names and format are the on-ZFS record's (package
// record); the slot manager calls these through package slots/apply.
package keys

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	hclog "github.com/hashicorp/go-hclog"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ZFS is what Create asks of ZFS (the zfs package's Client).
type ZFS interface {
	Create(ctx context.Context, name string, props map[string]string) error
	GetExact(ctx context.Context, name, prop string) (zfs.Prop, error)
}

// Create makes the fresh dataset of a CreateSlot of an encrypted class,
// its key in keyDir: a new key first (on disk and fsynced), then the
// dataset that points to it. On failure the key is removed: no dataset
// uses it.
func Create(ctx context.Context, z ZFS, log hclog.Logger, keyDir string, a reconcile.Action) error {
	if keyDir == "" {
		return fmt.Errorf("class %q is encrypted, and no key directory is configured", a.Class)
	}
	id, err := record.NewKey(keyDir)
	if err != nil {
		return err
	}
	props := make(map[string]string, len(a.Props)+4)
	for k, v := range a.Props {
		props[k] = v
	}
	for k, v := range record.EncryptionProps(keyDir, id) {
		props[k] = v
	}
	if err := z.Create(ctx, a.Dataset, props); err != nil {
		// A create can fail and still have made the dataset (a timeout,
		// "created, but not mounted"): the key goes only when ZFS says
		// the dataset does not exist. Otherwise it stays (an unused key
		// costs 32 bytes; a missing one costs the data).
		_, gerr := z.GetExact(context.WithoutCancel(ctx), a.Dataset, record.PropKeyID)
		if !errors.Is(gerr, zfs.ErrNotExist) {
			log.Warn("creating an encrypted dataset failed, and it may exist: its key is kept",
				"dataset", a.Dataset, "key", record.KeyPath(keyDir, id), "error", err, "read", gerr)
			return err
		}
		if rerr := record.RemoveKey(keyDir, id); rerr != nil {
			log.Warn("key of a dataset that was not made could not be removed", "key", record.KeyPath(keyDir, id), "error", rerr)
		}
		return err
	}
	return nil
}

// Remove removes from keyDir the key of a dataset that a (successful)
// destroy action destroyed, when it had one.
func Remove(log hclog.Logger, keyDir string, a reconcile.Action) error {
	if a.KeyID == "" || keyDir == "" {
		return nil
	}
	path := record.KeyPath(keyDir, a.KeyID)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		log.Warn("destroyed an encrypted dataset whose key is not in key_dir (was key_dir changed? remove the key where it is)",
			"dataset", a.Dataset, "key_id", a.KeyID, "key_dir", keyDir)
		return nil
	}
	if err := record.RemoveKey(keyDir, a.KeyID); err != nil {
		return fmt.Errorf("%s destroyed, its key %s not removed: %w", a.Dataset, path, err)
	}
	log.Info("key removed", "dataset", a.Dataset, "key", path)
	return nil
}
