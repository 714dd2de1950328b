package nulldevice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
)

// relink points link at target, replacing it whole (as the floor driver
// does: a new link renamed over the old one).
func relink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".new"
	must.NoError(t, os.Symlink(target, tmp))
	must.NoError(t, os.Rename(tmp, link))
}

// A device whose host directory is a link is given the link's target, one
// per tenant: a Reserve that comes before the link has moved on waits for
// it, or fails naming the device and the link when its deadline comes; a
// plain directory is given at once, every time.
func TestHandOut(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	plain, link := filepath.Join(dir, "null-0"), filepath.Join(dir, "null-1")
	for _, d := range []string{a, b, plain} {
		must.NoError(t, os.Mkdir(d, 0o777))
	}
	must.NoError(t, os.Symlink(a, link))
	p := New(hclog.NewNullLogger())
	cases := []struct {
		name    string
		id      string
		path    string
		moveTo  string        // the link is pointed here after delay, when set
		delay   time.Duration // how long after the call
		timeout time.Duration // the caller's deadline
		want    string
		err     error
	}{
		{name: "a plain directory", id: "null-0", path: plain, timeout: time.Second, want: plain},
		{name: "a plain directory again, at once", id: "null-0", path: plain, timeout: time.Second, want: plain},
		{name: "a link's target", id: "null-1", path: link, timeout: time.Second, want: a},
		{name: "the link not moved on: the Reserve fails", id: "null-1", path: link, timeout: 100 * time.Millisecond, err: ErrNotMovedOn},
		{name: "the link moved on while the Reserve waits", id: "null-1", path: link, moveTo: b, delay: 100 * time.Millisecond, timeout: 5 * time.Second, want: b},
		{name: "another device's first tenant is given the same target", id: "null-2", path: link, timeout: time.Second, want: b},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			if tc.moveTo != "" {
				timer := time.AfterFunc(tc.delay, func() { relink(t, tc.moveTo, link) })
				t.Cleanup(func() { timer.Stop() })
			}
			start := time.Now()
			got, err := p.handOut(ctx, tc.id, tc.path)
			if tc.err != nil {
				must.True(t, errors.Is(err, tc.err), must.Sprintf("error %v", err))
				must.StrContains(t, err.Error(), tc.id)
				must.StrContains(t, err.Error(), tc.path)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
			must.GreaterEq(t, tc.delay, time.Since(start))
		})
	}
}

// Through the wire, a Reserve binds the link's target.
func TestReserveFollowsLink(t *testing.T) {
	dir := t.TempDir()
	c, err := configure(t, block("null", "1", dir, "/zfs/scratch", "ZFS_SCRATCH_PATH"))
	must.NoError(t, err)
	target := filepath.Join(dir, "tenant-1")
	must.NoError(t, os.Mkdir(target, 0o777))
	must.NoError(t, os.Rename(filepath.Join(dir, "null-0"), filepath.Join(dir, "old")))
	must.NoError(t, os.Symlink(target, filepath.Join(dir, "null-0")))
	res, err := c.Reserve("null-0")
	must.NoError(t, err)
	must.SliceLen(t, 1, res.GetMounts())
	must.Eq(t, target, res.GetMounts()[0].GetHostPath())
}
