package zfs_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMountChanging(t *testing.T) {
	cases := []struct {
		pool bool
		args []string
		want bool
	}{
		{args: []string{"create", "-o", "refquota=1", "p/a"}, want: true},
		{args: []string{"unmount", "p/a"}, want: true},
		{args: []string{"mount", "p/a"}, want: true},
		{args: []string{"rename", "p/a", "p/b"}, want: true},
		{args: []string{"destroy", "p/a"}, want: true},
		{args: []string{"clone", "p/a@s", "p/b"}, want: true},
		{args: []string{"receive", "p/b"}, want: true},
		{args: []string{"receive", "-u", "p/b"}},
		{args: []string{"set", "mountpoint=/x", "p/a"}, want: true},
		{args: []string{"set", "canmount=noauto", "p/a"}, want: true},
		{args: []string{"inherit", "mountpoint", "p/a"}, want: true},
		{args: []string{"set", "nomad-device-zfs:state=archived", "p/a"}},
		{args: []string{"get", "-H", "mounted", "p/a"}},
		{args: []string{"send", "p/a@s"}},
		{args: nil},
		{pool: true, args: []string{"export", "p"}, want: true},
		{pool: true, args: []string{"destroy", "p"}, want: true},
		{pool: true, args: []string{"list", "-H", "p"}},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, zfs.MountChanging(tc.pool, tc.args), must.Sprintf("pool=%v %q", tc.pool, tc.args))
	}
}

// On zfs-fuse (the gate on), a command that mounts or unmounts waits while
// another runs, whichever Runner runs it, for the other's lease at most,
// and other commands do not; with the gate off (the kernel module),
// nothing waits. The real zfs runs behind
// a wrapper that pauses an unmount.
func TestRunner_MountsOneAtATime(t *testing.T) {
	pool := zfstest.NewPool(t, 0)
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	cases := []struct {
		name   string
		gate   bool
		second func(b string) []string // the command run while the unmount is paused
		waits  bool
		// lease, when set, is mountLease: the second command waits that
		// long, then runs with the first one still paused.
		lease time.Duration
	}{
		{name: "a create waits for the unmount", gate: true, lease: time.Minute, second: func(b string) []string { return []string{"create", b} }, waits: true},
		{name: "a stuck unmount holds the others for its lease only", gate: true, lease: 1500 * time.Millisecond, second: func(b string) []string { return []string{"create", b} }},
		{name: "a read does not wait", gate: true, second: func(b string) []string { return []string{"get", "-H", "-o", "value", "mounted", pool.Name} }},
		{name: "gate off: a create does not wait", second: func(b string) []string { return []string{"create", b} }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			zfs.SetMountsOneAtATime(t, tc.gate)
			zfs.SetMountLockPath(t, filepath.Join(t.TempDir(), "mounts.lock")) // no other process's turn
			if tc.lease > 0 {
				zfs.SetMountLease(t, tc.lease)
			}
			a, b := pool.Dataset(fmt.Sprintf("gate-a%d", i)), pool.Dataset(fmt.Sprintf("gate-b%d", i))
			pool.ZFS(t, "create", a)
			w.PauseFor("unmount", a)
			t.Cleanup(func() { w.Resume("unmount") })
			logger, logged := warnings()
			first := make(chan error, 1)
			go func() {
				_, err := (&zfs.Runner{Logger: logger}).ZFSCmd(context.Background(), "unmount", a)
				first <- err
			}()
			w.WaitPaused(t, "unmount", 30*time.Second)

			args := tc.second(b)
			second := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := (&zfs.Runner{}).ZFSCmd(context.Background(), args...) // another Runner
				second <- err
			}()
			if tc.waits {
				mustWaitForResume(t, w, "unmount", first, second, args)
				return
			}
			mustGoOn(t, "unmount", second, args)
			took := time.Since(start)
			if tc.lease > 0 {
				must.GreaterEq(t, tc.lease/2, took) // the lease began with the unmount, before start
				must.Eq(t, "unmount", w.WaitPaused(t, "unmount", time.Second)[0], must.Sprint("the unmount is still paused"))
				must.StrContains(t, logged(), "runs past its turn", must.Sprint("the lapse of the unmount's turn is logged"))
				must.Less(t, tc.lease+5*time.Second, took)
			} else {
				must.Less(t, time.Second, took, must.Sprintf("%q waited", args))
			}
			w.Resume("unmount")
			must.NoError(t, <-first)
		})
	}
}

// warnings returns a logger at WARN and what it has logged so far.
func warnings() (hclog.Logger, func() string) {
	var log bytes.Buffer
	var mu sync.Mutex
	logger := hclog.New(&hclog.LoggerOptions{Output: &lockedWriter{w: &log, mu: &mu}, Level: hclog.Warn})
	return logger, func() string {
		mu.Lock()
		defer mu.Unlock()
		return log.String()
	}
}

// lockedWriter serialises writes to w: the logger writes from the
// command's goroutine and its lease's timer.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
