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
		{"cannot create 'ztest/nomad/scratch/0': dataset already exists", ErrExist},
		{"umount: /tmp/zt/mnt/x: target is busy.\ncannot unmount '/tmp/zt/mnt/x': umount failed", ErrBusy},
		{"cannot destroy 'tank/a': dataset is busy", ErrBusy},
		{"cannot open 'nosuch': no such pool", ErrNotExist},
		{"connect: No such file or directory\nPlease make sure that the zfs-fuse daemon is running.", ErrUnavailable},
		{"The ZFS modules are not loaded.\nTry running '/sbin/modprobe zfs' as root to load them.\nfailed to initialize the libzfs library", ErrUnavailable},
		{"cannot create 'ztest/x': 'compression' must be one of 'on | off'", ErrInvalid},
		{"cannot set property for 'ztest/nomad': invalid numeric suffix 'Q'", ErrInvalid},
		{"cannot create 'tank/a': no space left on device", ErrNoSpace},
		{"something else entirely", nil},
	}
	for _, tc := range cases {
		got := classify(tc.stderr)
		must.True(t, errors.Is(got, tc.want) || (got == nil && tc.want == nil), must.Sprintf("%q: got %v want %v", tc.stderr, got, tc.want))
	}
}

// What real zfs and zpool commands printed (testdata/README.md says where
// each file comes from) maps to the right sentinel.
func TestClassify_SavedStderr(t *testing.T) {
	cases := []struct {
		file string
		want error
	}{
		{"get-notexist-zfs-fuse-0.7.stderr", ErrNotExist},
		{"nonroot-zfs-get-openzfs-2.1.stderr", ErrUnavailable},
		{"nonroot-zpool-list-openzfs-2.1.stderr", ErrUnavailable},
		{"nonroot-zfs-get-openzfs-2.3.stderr", ErrUnavailable},
		{"nonroot-zpool-list-openzfs-2.3.stderr", ErrUnavailable},
		{"nomodule-zfs-get-openzfs-2.1.stderr", ErrUnavailable},
		{"nomodule-zpool-list-openzfs-2.1.stderr", ErrUnavailable},
		// OpenZFS 2.3 without its kernel module says what it says for a
		// missing dataset or pool: stderr alone cannot tell them apart.
		{"nomodule-zfs-get-openzfs-2.3.stderr", ErrNotExist},
		{"nomodule-zpool-list-openzfs-2.3.stderr", ErrNotExist},
		{"nospace-set-zfs-fuse-0.7.stderr", ErrNoSpace},
		{"nospace-create-zfs-fuse-0.7.stderr", ErrNoSpace},
		// zfs-fuse refusing a multi-property set on a full pool: the
		// cause that matters is the full pool.
		{"nospace-set-multi-zfs-fuse-0.7.stderr", ErrNoSpace},
		{"set-multi-zfs-fuse-0.7.stderr", ErrInvalid},
		{"set-bad-compression-openzfs-2.3.stderr", ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			stderr := strings.TrimSpace(string(mustRead(t, tc.file)))
			must.ErrorIs(t, classify(stderr), tc.want)
			// The message keeps what zfs said.
			e := &Error{Args: []string{"zfs", "get"}, Stderr: stderr, ExitCode: 1, Kind: classify(stderr)}
			must.StrContains(t, e.Error(), stderr)
		})
	}
}

// A multi-property `zfs set` refused by a zfs that takes one property is
// told apart from every other failure.
func TestMultiSetRefused(t *testing.T) {
	cases := []struct {
		file  string
		extra []string
		want  bool
	}{
		{"set-multi-zfs-fuse-0.7.stderr", []string{"x:b=2"}, true},
		{"set-multi-zfs-fuse-0.7.stderr", []string{"x:c=3"}, false},
		{"nospace-set-multi-zfs-fuse-0.7.stderr", []string{"x:r=full"}, true},
		{"nospace-set-zfs-fuse-0.7.stderr", []string{"x:r=full"}, false},
		{"set-bad-compression-openzfs-2.3.stderr", []string{"x:a=1"}, false},
		{"get-notexist-zfs-fuse-0.7.stderr", []string{"x:a=1"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			stderr := strings.TrimSpace(string(mustRead(t, tc.file)))
			err := &Error{Args: []string{"zfs", "set"}, Stderr: stderr, ExitCode: 1, Kind: classify(stderr)}
			must.Eq(t, tc.want, multiSetRefused(err, tc.extra))
		})
	}
	must.False(t, multiSetRefused(&Error{Stderr: "cannot open 'x:b=2'", ExitCode: -1}, []string{"x:b=2"}))
	must.False(t, multiSetRefused(errors.New("cannot open 'x:b=2'"), []string{"x:b=2"}))
}

func TestErrorMessageAndUnwrap(t *testing.T) {
	e := &Error{Args: []string{"zfs", "destroy", "tank/a"}, Stderr: "cannot destroy 'tank/a': dataset is busy", ExitCode: 1, Kind: ErrBusy}
	must.Eq(t, "zfs destroy tank/a: cannot destroy 'tank/a': dataset is busy", e.Error())
	must.ErrorIs(t, e, ErrBusy)
	must.False(t, errors.Is(e, ErrNotExist))
}

func mustRead(t *testing.T, name string) []byte { t.Helper(); return readTestdata(t, name) }
