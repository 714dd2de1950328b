package bench_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// The golden scenario runs end to end on a real pool at a small size and
// measures every figure it prints.
func TestRunGolden(t *testing.T) {
	zfstest.NewPool(t, 64<<20) // ZFS answers (or the test fails under CI)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	r, err := bench.RunGolden(ctx, bench.GoldenOptions{Reps: 2, Files: 4, MiB: 1, WorkDir: t.TempDir(), Progress: &progress})
	must.NoError(t, err, must.Sprint(progress.String()))
	for name, d := range map[string]time.Duration{"golden": r.GoldenP50, "empty": r.EmptyP50, "clone": r.RawCloneP50, "copy": r.CopyP50} {
		must.Positive(t, d, must.Sprint(name))
	}
	must.Positive(t, r.GoldenVsClone)
	must.Positive(t, r.GoldenVsEmpty)
	must.Positive(t, r.GoldenVsCopy)
	var out bytes.Buffer
	bench.WriteGolden(&out, r)
	must.StrContains(t, out.String(), "| raw `zfs clone` of the snapshot |")
}
