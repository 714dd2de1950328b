package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// unavailable says why ZFS could not be had; tests that need it stop on it.
var unavailable string

func TestMain(m *testing.M) {
	stop, err := StartFuse()
	if err != nil {
		unavailable = err.Error()
	}
	code := m.Run()
	if stop != nil {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox: stopping zfs-fuse: %v\n", err)
		}
	}
	os.Exit(code)
}

func needZFS(t *testing.T) {
	t.Helper()
	if unavailable != "" {
		testenv.Skip(t, unavailable)
	}
}

// TestCreatePoolAndDestroy proves the life of a sandbox pool on real ZFS: it
// exists, mounted under dir/mnt, with the prefix and a random suffix, and
// Destroy removes it.
func TestCreatePoolAndDestroy(t *testing.T) {
	needZFS(t)
	ctx := context.Background()
	dir := t.TempDir()
	p, err := CreatePool(ctx, dir, "ndzsb", 256<<20)
	must.NoError(t, err)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_ = p.Destroy()
		}
	})
	must.StrHasPrefix(t, "ndzsb", p.Name)
	must.EqOp(t, filepath.Join(dir, "mnt"), p.Mountpoint)
	must.EqOp(t, p.Name+"/a/b", p.Dataset("a/b"))

	out, err := p.Runner.ZFSCmd(ctx, "get", "-H", "-o", "value", "mountpoint", p.Name)
	must.NoError(t, err)
	must.EqOp(t, p.Mountpoint+"\n", string(out))

	other, err := CreatePool(ctx, t.TempDir(), "ndzsb", 256<<20)
	must.NoError(t, err)
	must.NoError(t, other.Destroy())
	must.NotEqOp(t, p.Name, other.Name, must.Sprint("each pool gets its own suffix"))

	must.NoError(t, p.Destroy())
	destroyed = true
	_, err = p.Runner.ZpoolCmd(ctx, "list", p.Name)
	must.ErrorIs(t, err, zfs.ErrNotExist)
}

// TestCreatePoolFailsClean proves that a failed CreatePool leaves neither a
// pool nor a backing file behind, and says why.
func TestCreatePoolFailsClean(t *testing.T) {
	needZFS(t)
	ctx := context.Background()
	cases := []struct {
		name string
		dir  func(t *testing.T) string
		size int64
	}{
		{name: "directory missing", dir: func(t *testing.T) string { return filepath.Join(t.TempDir(), "missing") }, size: 256 << 20},
		{name: "file below the 64 MiB minimum", dir: func(t *testing.T) string { return t.TempDir() }, size: 1 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir(t)
			p, err := CreatePool(ctx, dir, "ndzsbfail", tc.size)
			if p != nil {
				_ = p.Destroy()
			}
			must.Error(t, err)
			must.Nil(t, p)
			_, statErr := os.Stat(filepath.Join(dir, "pool.img"))
			must.True(t, os.IsNotExist(statErr), must.Sprintf("pool.img left behind: %v", statErr))
		})
	}
}

func TestRemoveStalePIDFile(t *testing.T) {
	dead := exec.Command("true")
	must.NoError(t, dead.Run())
	cases := []struct {
		name     string
		content  string // "" with write false: no file
		write    bool
		wantKept bool
	}{
		{name: "live process kept", content: strconv.Itoa(os.Getpid()) + "\n", write: true, wantKept: true},
		{name: "dead process removed", content: strconv.Itoa(dead.Process.Pid) + "\n", write: true},
		{name: "no PID removed", content: "garbage", write: true},
		{name: "empty removed", content: "", write: true},
		{name: "missing file is fine"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "zfs-fuse.pid")
			if tc.write {
				must.NoError(t, os.WriteFile(path, []byte(tc.content), 0o644))
			}
			removeStalePIDFile(path)
			_, err := os.Stat(path)
			must.EqOp(t, tc.wantKept, err == nil)
		})
	}
}
