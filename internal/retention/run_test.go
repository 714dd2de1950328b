package retention

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// savedArchive is a fake of the pruner's ZFS inside a synctest bubble,
// where a real zfs process cannot run on fake time: every read answers
// the saved zfs-fuse output of testdata (a container and three archives,
// each of its own identity), and each read's time is counted. A destroy
// changes nothing, so that an archive a rule prunes is pruned at every
// pass.
type savedArchive struct {
	mu sync.Mutex // guards ds, reads, destroyed
	ds []zfs.Dataset
	// second is a second allocation of web's identity (see newSavedArchive),
	// which addSecond puts in the reads from then on.
	second zfs.Dataset

	reads     []time.Time
	destroyed int
}

func newSavedArchive(t *testing.T) *savedArchive {
	t.Helper()
	ds := savedGet(t)
	// A second allocation of default/web/g[2]/server, released a day
	// later: with keep = 1 the older is pruned.
	for _, d := range ds {
		if strings.HasSuffix(d.Name, "/state-0.default.web.g.server.1a2b3c4d.20261120T101500Z") {
			c := zfs.Dataset{Name: strings.Replace(d.Name, "1a2b3c4d.20261120T", "1a2b3c4e.20261121T", 1), Props: map[string]zfs.Prop{}}
			for k, v := range d.Props {
				v.Value = strings.ReplaceAll(strings.ReplaceAll(v.Value, "1a2b3c4d-0000-4000-8000-000000000001", "1a2b3c4e-0000-4000-8000-000000000002"), "2026-11-20T", "2026-11-21T")
				c.Props[k] = v
			}
			return &savedArchive{ds: append(ds, c), second: c}
		}
	}
	t.Fatal("the saved output has no archive of web")
	return nil
}

// withoutSecond is newSavedArchive with web's second allocation left out
// until addSecond.
func withoutSecond(t *testing.T) *savedArchive {
	t.Helper()
	z := newSavedArchive(t)
	z.ds = z.ds[:len(z.ds)-1]
	return z
}

// addSecond puts web's second allocation in the reads from now on: a
// release of that identity, which keep = 1 prunes the older of.
func (z *savedArchive) addSecond() {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.ds = append(z.ds, z.second)
}

func (z *savedArchive) Get(_ context.Context, name string, _ int, _ ...string) ([]zfs.Dataset, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.reads = append(z.reads, time.Now())
	if name != "capt/nomad/.archive" {
		return nil, errors.New("not the saved container")
	}
	return slices.Clone(z.ds), nil
}

func (z *savedArchive) DestroyRecursive(context.Context, string, string) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.destroyed++
	return nil
}

func (z *savedArchive) SetMany(context.Context, string, map[string]string) error { return nil }

// readsSince returns the times of the reads after from, as offsets from it.
func (z *savedArchive) readsSince(from time.Time) []time.Duration {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []time.Duration
	for _, r := range z.reads {
		if r.After(from) {
			out = append(out, r.Sub(from))
		}
	}
	return out
}

// kickEverySecond runs p in the synctest bubble of t, waits for its pass at
// start, then kicks it every second for 40 s, the first half a second after
// the start (offsets are whole seconds: no kick meets a pass due at that
// moment), calling change (when not nil) before the eleventh kick, at
// 10.5 s. It returns the reads of z after the start, as offsets from it.
func kickEverySecond(t *testing.T, z *savedArchive, p *Pruner, change func()) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go p.Run(ctx, time.Minute)
	synctest.Wait() // the pass at start
	must.Len(t, 1, z.readsSince(time.Time{}))
	start := time.Now()
	time.Sleep(500 * time.Millisecond)
	for i := range 40 {
		if i == 10 && change != nil {
			change()
		}
		p.Kick()
		time.Sleep(time.Second)
		synctest.Wait()
	}
	return z.readsSince(start)
}

// everyKickGap is a read every KickGap over the 40.5 s of kicks.
var everyKickGap = func() []time.Duration {
	var out []time.Duration
	for d := KickGap; d <= 40*time.Second; d += KickGap {
		out = append(out, d)
	}
	return out
}()

// TestRun_KicksWhileNothingIsDue (issue 46): under a churn of short jobs
// every release kicks a retention pass, and each pass reads the whole
// archive. While the passes find nothing to prune (and no archive_quota
// is set) the kicks are served IdleKickGap apart. Where a rule prunes
// (keep here), or an archive_quota is set, kicks are served KickGap apart
// as before.
func TestRun_KicksWhileNothingIsDue(t *testing.T) {
	cases := []struct {
		name  string
		rules Rules
		// want: the reads of 40 s of kicks every second, from the first
		// kick after the pass at start.
		want   []time.Duration
		pruned bool
		unsent bool // every archive read as not in backup_dir yet
	}{
		{"nothing due: one read per IdleKickGap", Rules{Default: Policy{Keep: 3}},
			[]time.Duration{IdleKickGap}, false, false},
		{"a prune due (keep = 1, web's two allocations): one read per KickGap", Rules{Default: Policy{Keep: 1}},
			everyKickGap, true, false},
		{"archive_quota set: one read per KickGap", Rules{Default: Policy{Keep: 3}, Quota: 1 << 40},
			everyKickGap, false, false},
		// The older of web's archives is not in backup_dir: no rule prunes
		// it until the keeper sends it, and then kicks (OnSent). Those
		// kicks are served KickGap apart, not IdleKickGap.
		{"a prune held until the keeper sends: one read per KickGap", Rules{Default: Policy{Keep: 1, Backup: true}},
			everyKickGap, false, true},
		// Unsent archives all within keep: nothing is held back, idle as
		// with no backup_dir.
		{"backup_dir, unsent archives all within keep: one read per IdleKickGap", Rules{Default: Policy{Keep: 3, Backup: true}},
			[]time.Duration{IdleKickGap}, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				z := newSavedArchive(t)
				if tc.unsent {
					for _, d := range z.ds {
						delete(d.Props, PropBackup)
					}
				}
				p := New(z, hclog.NewNullLogger())
				p.SetConfig(Config{Container: "capt/nomad/.archive", Rules: tc.rules})
				must.Eq(t, tc.want, kickEverySecond(t, z, p, nil))
				z.mu.Lock()
				defer z.mu.Unlock()
				must.Eq(t, tc.pruned, z.destroyed > 0, must.Sprintf("destroyed %d", z.destroyed))
			})
		})
	}
}

// TestRun_IdleUntilSomethingChanges (issue 46): passes that found nothing
// to prune serve kicks IdleKickGap apart; a prune that becomes due (a
// second allocation of an identity with keep = 1, released at 10 s) is
// made at the end of that gap at most, and from then on kicks are served
// KickGap apart again; a new config (SetConfig at 10 s) is applied at the
// next kick, KickGap apart.
func TestRun_IdleUntilSomethingChanges(t *testing.T) {
	cases := []struct {
		name   string
		change func(z *savedArchive, p *Pruner)
		want   []time.Duration
		pruned bool
	}{
		{"a prune becomes due", func(z *savedArchive, _ *Pruner) { z.addSecond() },
			[]time.Duration{IdleKickGap, 32 * time.Second, 34 * time.Second, 36 * time.Second, 38 * time.Second, 40 * time.Second}, true},
		{"a new config", func(_ *savedArchive, p *Pruner) {
			p.SetConfig(Config{Container: "capt/nomad/.archive", Rules: Rules{Default: Policy{Keep: 2}}})
		}, []time.Duration{12 * time.Second}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				z := withoutSecond(t)
				p := New(z, hclog.NewNullLogger())
				p.SetConfig(Config{Container: "capt/nomad/.archive", Rules: Rules{Default: Policy{Keep: 1}}})
				must.Eq(t, tc.want, kickEverySecond(t, z, p, func() { tc.change(z, p) }))
				z.mu.Lock()
				defer z.mu.Unlock()
				must.Eq(t, tc.pruned, z.destroyed > 0, must.Sprintf("destroyed %d", z.destroyed))
			})
		})
	}
}
