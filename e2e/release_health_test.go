package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// TestReleaseHealthReachesNomad (issue 10): while a slot without a spare is
// released Nomad's node API shows it unhealthy, and healthy again once it
// is fresh; and a
// Reserve on the other, fresh slot is not held up by the release. A `zfs`
// wrapper first on the agent's PATH pauses the release's `zfs rename`, so
// the release stays under way as long as the test needs.
//
// Nomad's client coalesces node updates (about 1 s in dev mode, 5–10 s on
// a production client), so the figure the plugin controls is the time from
// the release's start to the fingerprint it sends: both are in the agent's
// log, and the test prints them.
func TestReleaseHealthReachesNomad(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs jobs")
	w := zfstest.NewWrapper(t)
	w.SetPATH(t) // before the agent: Nomad passes its environment to plugins
	e := &fcEnv{started: time.Now()}
	e.pool = zfstest.NewPool(t, 0)
	e.parent = e.pool.Dataset("nomad")
	e.pool.ZFS(t, "create", e.parent)
	bin := devicetest.BuildPlugin(t)
	e.agent = nomadtest.StartAgent(t, nomadtest.Options{
		PluginDir: filepath.Dir(bin),
		PluginConfig: fmt.Sprintf(`plugin "nomad-device-zfs" {
  config {
    parent_dataset     = %q
    fingerprint_period = "30s"
    class "scratch" {
      slots = 2
      quota = "32M"
    }
  }
}
`, e.parent),
	})
	a := e.agent
	a.WaitForDevice(t, "zfs", "dataset", "scratch", 2, deviceTimeout)

	// The slot's spare would serve at once while the release runs (see
	// internal/slots TestSpare_*): the zfs create that makes it fails, so
	// that this release is one Nomad must see.
	w.Fail("create", "cannot create: made to fail by the test")
	hold := a.RegisterJob(t, fcHoldJob("holder"))
	t1 := a.WaitForAlloc(t, hold, "running", jobTimeout, func(x *api.Allocation) bool {
		return x.ClientStatus == api.AllocClientStatusRunning
	})
	dev := deviceOf(t, t1)
	other := map[string]string{"scratch-0": "scratch-1", "scratch-1": "scratch-0"}[dev]
	a.Wait(t, "the owner recorded", holdTimeout, func() (bool, string) {
		o := recordedOwner(t, e.pool, e.slot(indexOf(dev)))
		return o.AllocID == t1.ID, "owner " + o.String()
	})
	e.step(t, "tenant %s holds %s", t1.ID[:8], dev)

	w.Pause("rename")
	_, _, err := a.API.Jobs().Deregister(hold.ID, false, nil)
	must.NoError(t, err)
	w.WaitPaused(t, "rename", releaseTimeout)
	e.step(t, "release of %s under way, its rename paused", dev)

	// Nomad shows it unhealthy, releasing.
	desc := waitInstance(t, e, dev, "unhealthy, releasing", 30*time.Second, func(h bool, d string) bool {
		return !h && strings.HasPrefix(d, "releasing: ")
	})
	shown := time.Now()
	e.step(t, "Nomad shows %s: %s", dev, desc)
	started, sent := releaseAndFingerprint(t, a.LogTail(5000), dev)
	e.step(t, "release started %s; fingerprint sent %s after it", started.Format("15:04:05.000"), sent.Sub(started))
	must.Less(t, time.Second, sent.Sub(started), must.Sprint("the fingerprint goes out at once when a release starts"))

	// The other slot is offered and served meanwhile.
	h, d, _ := instance(t, e, other)
	must.True(t, h, must.Sprint(d))
	t2 := a.RunJob(t, checkerJob("checker"), jobTimeout)
	must.EqOp(t, api.AllocClientStatusComplete, t2.ClientStatus)
	must.EqOp(t, other, deviceOf(t, t2))
	e.step(t, "tenant %s ran on %s while the release of %s was paused", t2.ID[:8], other, dev)
	must.EqOp(t, string(record.StateArchived), e.pool.Prop(t, e.slot(indexOf(dev)), record.PropState)) // its fate, recorded first

	// The release goes on: healthy again, and the data archived.
	w.Unfail("create")
	w.Resume("rename")
	resumed := time.Now()
	waitInstance(t, e, dev, "healthy again", releaseTimeout, func(h bool, d string) bool { return h })
	e.step(t, "%s healthy in Nomad %s after the rename went on (%s after Nomad showed it releasing)",
		dev, time.Since(resumed).Round(10*time.Millisecond), time.Since(shown).Round(10*time.Millisecond))
	// The spare made at the next pass may serve before the resumed rename
	// has moved the old dataset (seen on OpenZFS 2.3 under emulation): the
	// archive is waited for, not read once.
	a.Wait(t, "the data archived", releaseTimeout, func() (bool, string) {
		name := archivedFor(t, e.pool, e.archive(), t1.ID)
		return name != "", "no dataset in " + e.archive() + " owned by " + t1.ID[:8]
	})
}

// indexOf returns the slot index of a device ID such as "scratch-1".
func indexOf(dev string) int {
	var i int
	_, _ = fmt.Sscanf(dev[strings.LastIndex(dev, "-")+1:], "%d", &i)
	return i
}

// releaseAndFingerprint finds, in an agent log, when the plugin started the
// release of dev and when it next sent a fingerprint.
func releaseAndFingerprint(t *testing.T, log, dev string) (started, sent time.Time) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		line = strings.TrimSpace(line)
		ts, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		switch {
		case started.IsZero() && strings.Contains(rest, "release started:") && slices.Contains(strings.Fields(rest), "device="+dev):
			started = at
		case !started.IsZero() && strings.Contains(rest, "fingerprint sent:"):
			return started, at
		}
	}
	t.Fatalf("no release start of %s followed by a fingerprint in the agent log", dev)
	return
}
