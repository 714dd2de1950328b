package zfs

import (
	"errors"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		stderr string
		want   error
	}{
		{strings.TrimSpace(string(mustRead(t, "get-notexist-zfs-fuse-0.7.stderr"))), ErrNotExist},
		{"cannot create 'ztest/nomad/scratch/0': dataset already exists", ErrExist},
		{"umount: /tmp/zt/mnt/x: target is busy.\ncannot unmount '/tmp/zt/mnt/x': umount failed", ErrBusy},
		{"cannot destroy 'tank/a': dataset is busy", ErrBusy},
		{"cannot open 'nosuch': no such pool", ErrNotExist},
		{"connect: No such file or directory\nPlease make sure that the zfs-fuse daemon is running.", ErrUnavailable},
		{"The ZFS modules are not loaded.\nTry running '/sbin/modprobe zfs' as root to load them.\nfailed to initialize the libzfs library", ErrUnavailable},
		{"cannot create 'ztest/x': 'compression' must be one of 'on | off'", ErrInvalid},
		{"cannot set property for 'ztest/nomad': invalid numeric suffix 'Q'", ErrInvalid},
		{"something else entirely", nil},
	}
	for _, tc := range cases {
		got := classify(tc.stderr)
		must.True(t, errors.Is(got, tc.want) || (got == nil && tc.want == nil), must.Sprintf("%q: got %v want %v", tc.stderr, got, tc.want))
	}
}

func TestErrorMessageAndUnwrap(t *testing.T) {
	e := &Error{Args: []string{"zfs", "destroy", "tank/a"}, Stderr: "cannot destroy 'tank/a': dataset is busy", ExitCode: 1, Kind: ErrBusy}
	must.Eq(t, "zfs destroy tank/a: cannot destroy 'tank/a': dataset is busy", e.Error())
	must.ErrorIs(t, e, ErrBusy)
	must.False(t, errors.Is(e, ErrNotExist))
}

func mustRead(t *testing.T, name string) []byte { t.Helper(); return readTestdata(t, name) }
