package backup_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// node is one client's pool: a parent with an archive container and a
// keeper that backs up class "state" into a shared directory.
type node struct {
	pool   *zfstest.Pool
	cfg    slots.Config
	keeper *backup.Keeper
}

func newNode(t *testing.T, dir string) *node {
	t.Helper()
	pool := zfstest.NewPool(t, 512<<20)
	n := &node{pool: pool, cfg: slots.Config{Parent: pool.Dataset("nomad")}}
	pool.ZFS(t, "create", n.cfg.Parent)
	pool.ZFS(t, "create", "-o", slots.PropManaged+"="+slots.ManagedArchive, "-o", "canmount=noauto", n.cfg.ArchiveDataset())
	n.keeper = backup.NewKeeper(zfs.NewClient(pool.Runner), hclog.NewNullLogger())
	n.keeper.SetConfig(backup.Config{Dir: dir, Container: n.cfg.ArchiveDataset(), Classes: map[string]bool{"state": true}})
	return n
}

// archive makes an archive of o holding file "data" of mib MiB of random
// data, as a release leaves it, and returns its name.
func (n *node) archive(t *testing.T, o slots.Owner, mib int) string {
	t.Helper()
	name := slots.ArchivedName(n.cfg, "state", 0, o, time.Now().UTC())
	n.pool.ZFS(t, "create", name)
	n.write(t, name, mib)
	n.pool.ZFS(t, "set", "canmount=noauto", name)
	n.pool.ZFS(t, "set", slots.PropManaged+"="+slots.ManagedSlot, name)
	n.pool.ZFS(t, "set", slots.PropState+"="+string(slots.StateArchived), name)
	n.pool.ZFS(t, "set", slots.PropOwner+"="+o.Encode(), name)
	return name
}

// write replaces the dataset's file "data" with mib MiB of random data,
// mounting it for the while.
func (n *node) write(t *testing.T, ds string, mib int) {
	t.Helper()
	if n.pool.Prop(t, ds, "mounted") != "yes" {
		n.pool.ZFS(t, "mount", ds)
	}
	buf := make([]byte, mib<<20)
	_, err := rand.Read(buf)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(filepath.Join(n.pool.Prop(t, ds, "mountpoint"), "data"), buf, 0o600))
	n.pool.ZFS(t, "unmount", ds)
}

// sum returns the SHA-256 of the dataset's file "data".
func (n *node) sum(t *testing.T, ds string) string {
	t.Helper()
	n.pool.ZFS(t, "mount", ds)
	defer n.pool.ZFS(t, "unmount", ds)
	b, err := os.ReadFile(filepath.Join(n.pool.Prop(t, ds, "mountpoint"), "data"))
	must.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func tenant(n int) slots.Owner {
	return slots.Owner{AllocID: strings.Repeat(string(rune('0'+n)), 8) + "-1111-4222-8333-444444444444",
		Namespace: "default", Job: "db", Group: "g", Task: "t", AllocName: "db.g[0]"}
}

func TestBackup_FullThenIncrementalReceivedOnAnotherNode(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, b := newNode(t, dir), newNode(t, dir)

	// Node a: the first tenant's archive goes to backup_dir whole.
	arch := a.archive(t, tenant(1), 4)
	sent, more, err := a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.False(t, more)
	must.SliceLen(t, 1, sent)
	full := sent[0]
	must.Eq(t, uint64(0), full.BaseGUID)
	must.Positive(t, full.Size)
	must.Eq(t, retention.Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Index: 0, Class: "state"}, full.Identity)
	must.NoError(t, backup.Verify(full))
	must.StrHasPrefix(t, filepath.Join(dir, backup.Root)+"/", full.Path())
	must.Eq(t, itoa(full.GUID), a.pool.Prop(t, arch, retention.PropBackup))
	// Sent once: a second pass sends nothing.
	sent, _, err = a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, sent)

	// The same dataset comes back to the identity's next tenant (restore
	// marks it "none"), which changes it; its next archive goes
	// incrementally from the first backup.
	a.pool.ZFS(t, "set", slots.PropBackup+"="+slots.BackupNone, arch)
	a.write(t, arch, 1)
	sent, _, err = a.keeper.Pass(ctx)
	must.NoError(t, err)
	must.SliceLen(t, 1, sent)
	inc := sent[0]
	must.Eq(t, full.GUID, inc.BaseGUID)
	must.Less(t, full.Size, inc.Size, must.Sprint("an incremental stream carries the change, not the whole"))
	want := a.sum(t, arch)

	// Node b has no archive of the identity: Fetch receives the chain
	// (full, then incremental) into its archive, byte for byte.
	// A local archive released after the newest backup wins: nothing
	// is received.
	none, err := b.keeper.Fetch(ctx, "state", tenant(2), time.Now())
	must.NoError(t, err)
	must.Eq(t, "", none)
	got, err := b.keeper.Fetch(ctx, "state", tenant(2), time.Time{})
	must.NoError(t, err)
	must.StrHasPrefix(t, b.cfg.ArchiveDataset()+"/state-0.", got)
	must.Eq(t, want, b.sum(t, got))
	must.Eq(t, "archived", b.pool.Prop(t, got, slots.PropState))
	must.Eq(t, tenant(1).AllocID, ownerOf(t, b.pool, got).AllocID)
	must.Eq(t, itoa(inc.GUID), b.pool.Prop(t, got, retention.PropBackup), must.Sprint("not sent back"))
	// Another identity finds nothing.
	other := tenant(3)
	other.AllocName = "db.g[1]"
	none, err = b.keeper.Fetch(ctx, "state", other, time.Time{})
	must.NoError(t, err)
	must.Eq(t, "", none)
}

func TestBackup_DamagedStreamsAreNeverReceived(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"truncated", func(t *testing.T, path string) {
			fi, err := os.Stat(path)
			must.NoError(t, err)
			must.NoError(t, os.Truncate(path, fi.Size()/2))
		}},
		{"a byte flipped", func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			must.NoError(t, err)
			b[len(b)/2] ^= 0xff
			must.NoError(t, os.WriteFile(path, b, 0o600))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			a, b := newNode(t, dir), newNode(t, dir)
			a.archive(t, tenant(1), 2)
			sent, _, err := a.keeper.Pass(ctx)
			must.NoError(t, err)
			must.SliceLen(t, 1, sent)
			tc.damage(t, sent[0].StreamPath())

			must.True(t, errors.Is(backup.Verify(sent[0]), backup.ErrCorrupt))
			_, err = b.keeper.Fetch(ctx, "state", tenant(2), time.Time{})
			must.ErrorIs(t, err, backup.ErrCorrupt)
			left := b.pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", b.cfg.ArchiveDataset())
			must.Eq(t, b.cfg.ArchiveDataset(), strings.TrimSpace(left), must.Sprint("nothing received"))
		})
	}
}

func ownerOf(t *testing.T, pool *zfstest.Pool, ds string) slots.Owner {
	t.Helper()
	o, err := slots.DecodeOwner(pool.Prop(t, ds, slots.PropOwner))
	must.NoError(t, err)
	return o
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
