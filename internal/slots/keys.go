package slots

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// createEncrypted makes the fresh dataset of a CreateSlot of an encrypted
// class: a new key first (on disk and fsynced), then the dataset that
// points to it. On failure the key is removed: no dataset uses it.
func (m *Manager) createEncrypted(ctx context.Context, cfg Config, a reconcile.Action) error {
	if cfg.KeyDir == "" {
		return fmt.Errorf("class %q is encrypted, and no key directory is configured", a.Class)
	}
	id, err := record.NewKey(cfg.KeyDir)
	if err != nil {
		return err
	}
	props := make(map[string]string, len(a.Props)+4)
	for k, v := range a.Props {
		props[k] = v
	}
	for k, v := range record.EncryptionProps(cfg.KeyDir, id) {
		props[k] = v
	}
	if err := m.zfs.Create(ctx, a.Dataset, props); err != nil {
		// A create can fail and still have made the dataset (a timeout,
		// "created, but not mounted"): the key goes only when ZFS says
		// the dataset does not exist. Otherwise it stays (an unused key
		// costs 32 bytes; a missing one costs the data).
		_, gerr := m.zfs.GetExact(context.WithoutCancel(ctx), a.Dataset, record.PropKeyID)
		if !errors.Is(gerr, zfs.ErrNotExist) {
			m.log.Warn("creating an encrypted dataset failed, and it may exist: its key is kept",
				"dataset", a.Dataset, "key", record.KeyPath(cfg.KeyDir, id), "error", err, "read", gerr)
			return err
		}
		if rerr := record.RemoveKey(cfg.KeyDir, id); rerr != nil {
			m.log.Warn("key of a dataset that was not made could not be removed", "key", record.KeyPath(cfg.KeyDir, id), "error", rerr)
		}
		return err
	}
	return nil
}

// removeKey removes the key of a dataset that a (successful) destroy
// action destroyed, when it had one.
func (m *Manager) removeKey(cfg Config, a reconcile.Action) error {
	if a.KeyID == "" || cfg.KeyDir == "" {
		return nil
	}
	path := record.KeyPath(cfg.KeyDir, a.KeyID)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("destroyed an encrypted dataset whose key is not in key_dir (was key_dir changed? remove the key where it is)",
			"dataset", a.Dataset, "key_id", a.KeyID, "key_dir", cfg.KeyDir)
		return nil
	}
	if err := record.RemoveKey(cfg.KeyDir, a.KeyID); err != nil {
		return fmt.Errorf("%s destroyed, its key %s not removed: %w", a.Dataset, path, err)
	}
	m.log.Info("key removed", "dataset", a.Dataset, "key", path)
	return nil
}
