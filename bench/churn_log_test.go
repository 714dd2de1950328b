package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// A release served by its spare is done once the old dataset is retired;
// one without a spare once the fresh dataset is made. The lines are the
// shapes the plugin logs (saved from a churn run's agent log).
func TestOpenReleases(t *testing.T) {
	const log = `    2026-11-23T18:30:53.593Z [INFO]  client.device_mgr.nomad-device-zfs: release started: plugin=nomad-device-zfs device=scratch-1 owner="allocation d286270f (\"default\"/\"job-a\", group \"g\", task \"t\")" spare=p/nomad/scratch/1.alt dataset=p/nomad/scratch/1 on_release=archive
    2026-11-23T18:30:53.600Z [INFO]  client.device_mgr.nomad-device-zfs: release started: plugin=nomad-device-zfs device=scratch-2 owner="allocation 12f01ca1 (\"default\"/\"job-b\", group \"g\", task \"t\")" dataset=p/nomad/scratch/2 on_release=archive
    2026-11-23T18:30:54.490Z [INFO]  client.device_mgr.nomad-device-zfs: slot changed: plugin=nomad-device-zfs prop="" dataset=p/nomad/scratch/1 target=p/nomad/.archive/x value="" action="move released slot to the archive"
    2026-11-23T18:30:55.738Z [INFO]  client.device_mgr.nomad-device-zfs: slot changed: plugin=nomad-device-zfs action="create slot" prop="" dataset=p/nomad/scratch/2 target="" value=""
`
	lg, err := readChurnLog(strings.NewReader(log), "p/nomad", "scratch")
	must.NoError(t, err)
	must.Len(t, 2, lg.Releases)
	must.True(t, lg.Releases[0].Spare)
	must.Eq(t, "job-a", lg.Releases[0].Job)
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		must.NoError(t, err)
		return v
	}
	for _, tc := range []struct {
		at   string
		open []string
	}{
		{"2026-11-23T18:30:53.000Z", nil},
		{"2026-11-23T18:30:54.000Z", []string{"scratch-1", "scratch-2"}},
		{"2026-11-23T18:30:55.000Z", []string{"scratch-2"}},
		{"2026-11-23T18:30:56.000Z", nil},
	} {
		must.Eq(t, tc.open, openReleases(lg, at(tc.at)), must.Sprint("at ", tc.at))
	}
}
