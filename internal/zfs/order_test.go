package zfs_test

import (
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// The runner's ordering tests (priority, mount gate) pause a first command
// with a wrapper, start a second one beside it, and check whether the
// second waits for the first: the helpers below are those checks.

// mustWaitForResume checks that the second command (args), started while
// the wrapper holds the first one (sub) paused, has neither ended after a
// second nor started, then resumes sub and checks that both end without
// error.
func mustWaitForResume(t *testing.T, w *zfstest.Wrapper, sub string, first, second <-chan error, args []string) {
	t.Helper()
	select {
	case err := <-second:
		t.Fatalf("%q ran while %s was paused (err %v)", args, sub, err)
	case <-time.After(time.Second):
	}
	must.False(t, ran(w, args), must.Sprintf("%q started before %s ended", args, sub))
	w.Resume(sub)
	must.NoError(t, <-first)
	must.NoError(t, <-second)
}

// mustGoOn checks that the second command (args) ends without error within
// 20 s, the first one (sub) still paused.
func mustGoOn(t *testing.T, sub string, second <-chan error, args []string) {
	t.Helper()
	select {
	case err := <-second:
		must.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatalf("%q waited for the paused %s", args, sub)
	}
}

// ran reports whether the wrapper recorded `zfs args`.
func ran(w *zfstest.Wrapper, args []string) bool {
	return slices.ContainsFunc(w.Calls(), func(c zfstest.Call) bool {
		return c.Cmd == "zfs" && slices.Equal(c.Args, args)
	})
}
