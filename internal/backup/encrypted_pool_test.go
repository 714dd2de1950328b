package backup_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// An encrypted archive goes to backup_dir raw, its key beside it, and
// another node with a key_dir of its own receives it, installs the key
// and opens the same bytes. On zfs-fuse, which has no encryption, the raw
// send is refused and nothing is left in backup_dir.
func TestBackup_EncryptedArchiveMovesWithItsKey(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, b := newNode(t, dir), newNode(t, dir)
	keysA, keysB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, k := range []string{keysA, keysB} {
		must.NoError(t, record.EnsureKeyDir(k))
	}
	a.keeper.SetConfig(backup.Config{Dir: dir, Container: a.cfg.ArchiveDataset(), Classes: map[string]bool{"state": true}, KeyDir: keysA})
	b.keeper.SetConfig(backup.Config{Dir: dir, Container: b.cfg.ArchiveDataset(), Classes: map[string]bool{"state": true}, KeyDir: keysB})

	caps, err := zfs.NewClient(a.pool.Runner).Probe(ctx, a.cfg.Parent+"/.probe-caps")
	must.NoError(t, err)
	if !caps.Encryption {
		// An archive that records a key ID (set by hand here): the raw
		// send is refused, and the pass says so.
		arch := a.archive(t, tenant(1), 1)
		id, err := record.NewKey(keysA)
		must.NoError(t, err)
		a.pool.ZFS(t, "set", record.PropKeyID+"="+id, arch)
		_, _, err = a.keeper.Pass(ctx)
		must.ErrorIs(t, err, zfs.ErrInvalid)
		ms, _, err := backup.List(dir, nil)
		must.NoError(t, err)
		must.SliceEmpty(t, ms)
		return
	}

	// An encrypted archive, as a release of an encrypted class leaves it.
	id, err := record.NewKey(keysA)
	must.NoError(t, err)
	o := tenant(1)
	name := record.ArchivedName(a.cfg.ArchiveDataset(), "state", 0, o, time.Now().UTC())
	args := []string{"create"}
	for k, v := range record.EncryptionProps(keysA, id) {
		args = append(args, "-o", k+"="+v)
	}
	a.pool.ZFS(t, append(args, name)...)
	a.write(t, name, 2)
	for _, kv := range []string{"canmount=noauto", record.PropManaged + "=" + record.ManagedSlot,
		record.PropState + "=" + string(record.StateArchived), record.PropOwner + "=" + o.Encode()} {
		a.pool.ZFS(t, "set", kv, name)
	}
	want := a.sum(t, name)

	sent, _, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	must.Eq(t, id, sent[0].KeyID)
	must.NoError(t, backup.Verify(sent[0]))
	saved := record.KeyPath(filepath.Dir(sent[0].Path()), id)
	fi, err := os.Stat(saved)
	must.NoError(t, err)
	must.Eq(t, os.FileMode(0o600), fi.Mode().Perm())

	got, err := b.keeper.Fetch(ctx, "state", tenant(2), retention.Archive{})
	must.NoError(t, err)
	must.NotEq(t, "", got)
	must.Eq(t, id, b.pool.Prop(t, got, record.PropKeyID))
	must.Eq(t, record.KeyLocation(keysB, id), b.pool.Prop(t, got, "keylocation"))
	kb, err := os.ReadFile(record.KeyPath(keysB, id))
	must.NoError(t, err)
	ka, err := os.ReadFile(record.KeyPath(keysA, id))
	must.NoError(t, err)
	must.Eq(t, ka, kb)
	b.pool.ZFS(t, "mount", "-l", got)
	b.pool.ZFS(t, "unmount", got)
	must.Eq(t, want, b.sum(t, got))
}
