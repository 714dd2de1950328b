package zfstest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

// TestReachable: every directory from dir up to the temp root gets others'
// r-x and nothing more (a directory with others' x only gains r).
func TestReachable(t *testing.T) {
	base := t.TempDir()
	must.NoError(t, os.Chmod(base, 0o700))
	mid := filepath.Join(base, "mid")
	must.NoError(t, os.Mkdir(mid, 0o751))
	leaf := filepath.Join(mid, "leaf")
	must.NoError(t, os.Mkdir(leaf, 0o700))

	Reachable(t, leaf)

	for _, tc := range []struct {
		dir  string
		want os.FileMode
	}{
		{leaf, 0o705},
		{mid, 0o755},
		{base, 0o705},
	} {
		fi, err := os.Stat(tc.dir)
		must.NoError(t, err)
		must.EqOp(t, tc.want, fi.Mode().Perm(), must.Sprint(tc.dir))
	}
}
