package periodic

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/devicetest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// The scenario end to end at a small size: 6 runs of 2 periodic jobs
// through 4 slots, so that runs of one parent overlap and it gathers more
// archives than keep = 2 before retention; every bound it judges holds,
// and every figure it prints is measured.
func TestRunPeriodic(t *testing.T) {
	testenv.SkipShort(t, "end-to-end: starts a Nomad agent and runs periodic jobs")
	zfstest.NewPool(t, 64<<20) // ZFS answers (or the test fails under CI)
	pluginBin, nomadBin := devicetest.BuildPlugin(t), nomadtest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	const jobs, parents, keep = 6, 2, 2
	r, err := Run(ctx, Options{Jobs: jobs, Parents: parents, Keep: keep, MoveReps: 2, PluginBin: pluginBin, NomadBin: nomadBin,
		WorkDir: t.TempDir(), Progress: &progress})
	must.NoError(t, err, must.Sprint(progress.String()))
	must.SliceEmpty(t, r.Violations)

	must.SliceLen(t, jobs, r.Runs)
	seen := map[string]bool{}
	for _, c := range r.Runs {
		must.EqOp(t, api.AllocClientStatusComplete, c.Status, must.Sprint(c.Job))
		must.EqOp(t, c.Parent, parentOf(c.Job))
		must.False(t, seen[c.Job], must.Sprint("a new job per run: ", c.Job))
		seen[c.Job] = true
	}
	must.Positive(t, r.JobsPerSecond)

	a := r.Archive
	must.MapLen(t, parents, a.PerParent)
	must.Between(t, 1, a.Max, keep)
	for _, rec := range a.Archives {
		must.EqOp(t, rec.Parent, rec.RecordedParent, must.Sprint(rec.Name))
		must.NotEq(t, "", rec.Backup, must.Sprint(rec.Name, " is in backup_dir"))
	}
	must.Positive(t, a.Bytes)
	must.Positive(t, a.Snapshots) // each archive in backup_dir keeps the base of its next increment

	b := r.Backup
	must.SliceEmpty(t, b.Stray)
	// A run's archive may be restored by the next run of its parent, or
	// pruned, before its send: not every run leaves a stream.
	must.GreaterEq(t, parents, b.Streams)
	must.Positive(t, b.KeptBytes)
	must.NotNil(t, b.After)
	must.EqOp(t, b.KeptBytes, b.After.Bytes)
	must.EqOp(t, parents, b.Verified)
	for p, n := range b.After.Chains {
		must.LessEq(t, keep, n, must.Sprint(p))
	}

	must.NotNil(t, r.Move)
	must.Positive(t, r.Move.MoveRatio)
	must.Positive(t, r.Move.FloorMiBps)

	var out bytes.Buffer
	WriteMarkdown(&out, r)
	t.Logf("%s\n%s\nthe plugin's warnings:\n%s", progress.String(), out.String(), strings.Join(r.Warnings, "\n"))
	for _, key := range []string{"archives-per-parent", "backup-dir-retention", "backup-dir-pruned", "send-ratio"} {
		must.StrContains(t, out.String(), "- "+key+":")
	}
}

func TestWarningKinds(t *testing.T) {
	lines := []string{
		`2026-12-05T22:20:45.720Z [ERROR] client.device_mgr.nomad-device-zfs: backup pass incomplete: plugin=nomad-device-zfs error="x: y"`,
		`2026-12-05T22:21:09.288Z [WARN]  client.device_mgr.nomad-device-zfs: an older snapshot of the keeper's was not destroyed; tried again at the next backup: plugin=nomad-device-zfs error="z"`,
		`2026-12-05T22:22:45.720Z [ERROR] client.device_mgr.nomad-device-zfs: backup pass incomplete: plugin=nomad-device-zfs @module=nomad-device-zfs.backup`,
	}
	must.EqOp(t, "2 × backup pass incomplete, 1 × an older snapshot of the keeper's was not destroyed; tried again at the next backup", warningKinds(lines))
}

func TestParentOf(t *testing.T) {
	cases := []struct{ job, want string }{
		{job: "nightly-3/periodic-1733400000", want: "nightly-3"},
		{job: "nightly-3", want: ""},
		{job: "other/periodic-1733400000", want: ""},
		{job: "nightly-3/dispatch-1733400000-abcd", want: ""},
	}
	for _, tc := range cases {
		t.Run(tc.job, func(t *testing.T) {
			must.EqOp(t, tc.want, parentOf(tc.job))
		})
	}
}

// The archive counts as settled only after the archive has stayed as it is
// for longer than retention may wait to serve the kick of the last release
// (IdleKickGap, after a pass that found nothing to prune), with a backup
// pass on either side: at 10 s, TestRunPeriodic counted a parent's archives
// before the prune of its third (CI of 2026-12-07: 3 archives, keep = 2).
func TestSettleOutlastsRetentionsWait(t *testing.T) {
	must.Greater(t, retention.IdleKickGap+retention.KickGap, settleQuiet)
}
