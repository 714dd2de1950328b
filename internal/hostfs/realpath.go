package hostfs

import "path/filepath"

// RealPath returns absolute path p with the symlinks of its existing
// leading components resolved, and the components that do not exist yet
// appended as they are: where p is, or would be once made. A path that
// goes through a symlink into a mount is inside that mount, which a
// comparison of the strings does not show.
func RealPath(p string) string {
	cur, rest := filepath.Clean(p), ""
	for {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return filepath.Clean(p)
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}
