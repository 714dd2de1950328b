package hostfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

func TestRealPath(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	must.NoError(t, err)
	target := filepath.Join(dir, "mnt", "shared")
	must.NoError(t, os.MkdirAll(target, 0o700))
	must.NoError(t, os.Symlink(target, filepath.Join(dir, "link")))
	must.NoError(t, os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(dir, "dangling")))

	for _, tc := range []struct{ name, in, want string }{
		{"no symlink", filepath.Join(dir, "mnt"), filepath.Join(dir, "mnt")},
		{"the symlink itself", filepath.Join(dir, "link"), target},
		{"below it, existing", filepath.Join(dir, "link", "."), target},
		{"below it, not made yet", filepath.Join(dir, "link", "keys", "x"), filepath.Join(target, "keys", "x")},
		{"nothing exists", filepath.Join(dir, "a", "b"), filepath.Join(dir, "a", "b")},
		{"a dangling symlink is kept as it is", filepath.Join(dir, "dangling", "x"), filepath.Join(dir, "dangling", "x")},
		{"unclean", dir + "//link/../link/keys", filepath.Join(target, "keys")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, RealPath(tc.in))
		})
	}
}
