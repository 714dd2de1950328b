package slots_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// releaseCalls is the zfs commands the release of slot scratch-0 runs,
// each as its subcommand and arguments with the slot's dataset written
// DS and its archive ARCH (a read, "get"), from its owner's end until the release is
// over (ReleaseEnded, then Wait): the churn's path, a slot whose spare
// is ready when its tenant ends. A command repeated at once (the
// runner's retries of a busy answer) is one entry; retries says how many
// runs it left out.
func releaseCalls(t *testing.T, onRelease string) (calls []string, retries int, e *env) {
	t.Helper()
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e = newEnv(t, 1)
	e.cfg.Classes[0].OnRelease = onRelease
	e.mgr.SetConfig(e.cfg)
	a := newAllocs()
	e.mgr.SetNomad(a)
	e.sync(t)
	o := owner(7)
	s := reserveAndWrite(t, e, a, "scratch-0", o)
	must.NotEq(t, "", slotByID(t, e, "scratch-0").Spare, must.Sprint("the churn's path: the spare is ready"))
	from := len(w.Calls())

	a.end(o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, e.mgr.ReleaseEnded(ctx))
	must.NoError(t, e.mgr.Wait(ctx))

	arch := e.cfg.ArchiveDataset() + "/"
	prev := ""
	for _, c := range w.Calls()[from:] {
		if c.Cmd != "zfs" {
			continue
		}
		args := make([]string, len(c.Args))
		for i, x := range c.Args {
			switch {
			case x == s.Dataset:
				x = "DS"
			case strings.HasPrefix(x, arch):
				x = "ARCH"
			}
			args[i] = x
		}
		line := strings.Join(args, " ")
		if args[0] == "get" {
			line = "get" // a read of the slot's datasets by name
		}
		if line == prev {
			retries++
			continue
		}
		calls, prev = append(calls, line), line
	}
	return calls, retries, e
}

// TestRelease_ZFSCommandsOfARelease (issue 46): the zfs processes of one
// release, in order, counted through a wrapper first on PATH. Where the
// release unmounts (zfs-fuse), the unmount is `zfs set canmount=off`:
// one process that unmounts the dataset and records that nothing mounts
// it again by itself, where an unmount and a `zfs set canmount=noauto`
// took two. The fate, written first, stays a command of its own: it is
// the record a crash is recovered from. Where the rename unmounts
// (OpenZFS), the release runs no unmount and sets canmount=noauto.
func TestRelease_ZFSCommandsOfARelease(t *testing.T) {
	for _, tc := range []struct {
		onRelease string
		fate      record.State
		after     []string // after the rename
	}{
		{slots.OnReleaseArchive, record.StateArchived, nil},
		// The destroy is decided from a read, and a read follows it:
		// the first steps (knownRelease) end at the rename.
		{slots.OnReleaseDestroy, record.StateDestroying, []string{"get", "destroy -r ARCH", "get"}},
	} {
		t.Run(tc.onRelease, func(t *testing.T) {
			calls, retries, e := releaseCalls(t, tc.onRelease)
			t.Logf("zfs commands of the release: %q (busy retries left out: %d)", calls, retries)
			want := []string{"set " + record.PropState + "=" + string(tc.fate) + " DS"}
			if e.cfg.RenameUnmounts {
				want = append(want, "set canmount=noauto DS")
			} else {
				want = append(want, "set canmount=off DS")
			}
			want = append(append(want, "rename DS ARCH"), tc.after...)
			must.Eq(t, want, calls)
		})
	}
}

// TestRelease_NoBusyRenameBehindTheUnmount (issue 46): on zfs-fuse a
// rename right behind a plain `zfs unmount` is refused "dataset is busy"
// most of the time, with nothing else running (19 renames of 24 on an
// idle machine; they went through 26-95 ms after the unmount returned):
// zfs-fuse's daemon lets go of the dataset after the command returns.
// Behind the release's unmount, `zfs set canmount=off`, it is not (0 of
// 24): the property is written after the unmount, and by the time that
// command returns the daemon has let go. So six releases in a row run
// six renames, counted through a wrapper, not six and their busy retries
// (one is let through for a moment of load beside the test).
func TestRelease_NoBusyRenameBehindTheUnmount(t *testing.T) {
	w := zfstest.NewWrapper(t)
	w.SetPATH(t)
	e, a := newReleaseEnv(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const releases = 6
	var renamed []string
	for i := 0; i < releases; i++ {
		o := owner(20 + i)
		s := reserveAndWrite(t, e, a, "scratch-0", o)
		from := len(w.Calls())
		a.end(o)
		must.NoError(t, e.mgr.ReleaseEnded(ctx))
		must.NoError(t, e.mgr.Wait(ctx))
		for _, c := range w.Calls()[from:] {
			if c.Cmd == "zfs" && len(c.Args) == 3 && c.Args[0] == "rename" && c.Args[1] == s.Dataset {
				renamed = append(renamed, c.Args[2])
			}
		}
	}
	must.SliceLen(t, releases, archived(t, e))
	retries := len(renamed) - releases
	t.Logf("%d releases ran %d renames", releases, len(renamed))
	must.LessEq(t, 1, retries, must.Sprintf("busy retries of the rename: %q", renamed))
}
