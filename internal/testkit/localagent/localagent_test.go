package localagent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

func TestCachedBinaryPath(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/x/cache")
	p, err := CachedBinaryPath("v1.2.3")
	must.NoError(t, err)
	must.EqOp(t, "/x/cache/nomad-device-zfs/nomad-v1.2.3", p)

	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/home/u")
	p, err = CachedBinaryPath("v1.2.3")
	must.NoError(t, err)
	must.EqOp(t, "/home/u/.cache/nomad-device-zfs/nomad-v1.2.3", p)
}

// ProcStat counts the fields from after the command name's last ')', which
// may hold spaces and parentheses; a file without a name is an error.
func TestProcStat(t *testing.T) {
	cases := []struct {
		name, stat, comm string
		fields           []string
		err              bool
	}{
		{name: "plain", stat: "42 (zfs-fuse) S 1 42\n", comm: "zfs-fuse", fields: []string{"S", "1", "42"}},
		{name: "spaces and parentheses", stat: "7 (a) (b c) D 3 7\n", comm: "a) (b c", fields: []string{"D", "3", "7"}},
		{name: "no name", stat: "7 S 3\n", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			must.NoError(t, os.WriteFile(filepath.Join(dir, "stat"), []byte(tc.stat), 0o644))
			comm, fields, err := ProcStat(dir)
			if tc.err {
				must.Error(t, err)
				return
			}
			must.NoError(t, err)
			must.EqOp(t, tc.comm, comm)
			must.Eq(t, tc.fields, fields)
		})
	}
}
