package zfstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Reachable makes dir and its parents up to the temp root searchable and
// readable by everyone (others' r-x added, nothing else changed): t.TempDir
// directories are 0700, and a pool's mountpoint lies under one, while a test
// that runs a command as another host user (nobody) needs that user to reach
// the dataset as any host user would. Directories outside os.TempDir are
// left alone.
func Reachable(t testing.TB, dir string) {
	t.Helper()
	root := filepath.Clean(os.TempDir())
	for d := filepath.Clean(dir); strings.HasPrefix(d, root+"/"); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatalf("%v", err)
		}
		if perm := fi.Mode().Perm(); perm&0o005 != 0o005 {
			if err := os.Chmod(d, perm|0o005); err != nil {
				t.Fatalf("%v", err)
			}
		}
	}
}
