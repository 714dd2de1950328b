package localagent

import (
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
