package churn

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

// A Reserve's zfs command is read from the runner's "ran" line: only a
// successful set of the slot's state on one of the class's slots counts,
// and only inside the "devices" hook that timed the Reserve. The lines are
// from a churn run's agent log (a fresh slot: hook 32.9 ms, command 30.7).
func TestReserveCommand(t *testing.T) {
	const log = `    2026-11-24T21:28:13.614Z [TRACE] agent.plugin_loader.nomad-device-zfs: ran: plugin_dir=/tmp/x/plugins args=[set, nomad-device-zfs-probe:a=1, nomad-device-zfs-probe:b=1, p/nomad/.probe-88f1c009-caps] duration="8.97153e+06" yielded=0 @module=nomad-device-zfs.zfs cmd=zfs error="exit status 1" timestamp=2026-11-24T21:28:13.614Z
    2026-11-24T21:28:37.120Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs duration="2.0e+07" error="exit status 1" @module=nomad-device-zfs.zfs args=[set, nomad-device-zfs:state=reserved, p/nomad/scratch/3] cmd=zfs yielded=0 timestamp=2026-11-24T21:28:37.240Z
    2026-11-24T21:28:37.230Z [TRACE] client.alloc_runner.task_runner: running prestart hook: alloc_id=ae5c09c9-7bc0-8e4f-d7bb-78b351465c2d task=t name=devices start="2026-11-24 21:28:37.230650292 +0000 UTC m=+23.773412832"
    2026-11-24T21:28:37.250Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs duration="5e+06" error=<nil> @module=nomad-device-zfs.zfs args=[set, nomad-device-zfs:state=reserved, p/nomad/other/3] cmd=zfs yielded=0 timestamp=2026-11-24T21:28:37.250Z
    2026-11-24T21:28:37.251Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs duration="5e+06" error=<nil> @module=nomad-device-zfs.zfs args=[get, -H, -p, -o, name,property,value,source, all, p/nomad/scratch/3] cmd=zfs yielded=0 timestamp=2026-11-24T21:28:37.251Z
    2026-11-24T21:28:37.263Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs duration="3.074848e+07" error=<nil> @module=nomad-device-zfs.zfs args=[set, nomad-device-zfs:state=reserved, p/nomad/scratch/3] cmd=zfs yielded=0 timestamp=2026-11-24T21:28:37.263Z
    2026-11-24T21:28:37.263Z [INFO]  client.device_mgr.nomad-device-zfs: slot reserved: plugin=nomad-device-zfs @module=nomad-device-zfs.slots dataset=p/nomad/scratch/3 device=scratch-3 owner="allocation ae5c09c9 (\"default\"/\"churn-05-device-03\", group \"g\", task \"t\")" took="3.1731138e+07" how=fresh timestamp=2026-11-24T21:28:37.263Z
    2026-11-24T21:28:37.263Z [TRACE] client.alloc_runner.task_runner: finished prestart hook: alloc_id=ae5c09c9-7bc0-8e4f-d7bb-78b351465c2d task=t name=devices end="2026-11-24 21:28:37.26354853 +0000 UTC m=+23.806311070" duration=32.898238ms
    2026-11-24T21:28:40.617Z [TRACE] client.device_mgr.nomad-device-zfs: ran: plugin=nomad-device-zfs args=[set, nomad-device-zfs:state=archived, p/nomad/scratch/3.alt] cmd=zfs duration="1.9480667e+07" error=<nil> @module=nomad-device-zfs.zfs yielded=0 timestamp=2026-11-24T21:28:40.615Z
`
	lg, err := readChurnLog(strings.NewReader(log), "p/nomad", "scratch")
	must.NoError(t, err)
	must.Len(t, 2, lg.Marks, must.Sprint(lg.Marks))
	must.Eq(t, "scratch-3", lg.Marks[1].Device)
	must.Eq(t, "p/nomad/scratch/3.alt", lg.Marks[1].Dataset)
	h, ok := lg.Hooks["ae5c09c9-7bc0-8e4f-d7bb-78b351465c2d"]
	must.True(t, ok)
	for _, tc := range []struct {
		device string
		want   time.Duration
	}{
		{"scratch-3", 30748480 * time.Nanosecond},
		{"scratch-2", 0},
	} {
		must.Eq(t, tc.want, reserveCommand(lg, tc.device, h), must.Sprint(tc.device))
	}
	// The plugin's own part of that Reserve, from its "slot reserved" line.
	must.Eq(t, logEvent{At: lg.Reserved[0].At, Device: "scratch-3", Job: "churn-05-device-03", Text: "fresh", Took: 31731138 * time.Nanosecond}, reservedIn(lg, "scratch-3", h))
	must.Eq(t, logEvent{}, reservedIn(lg, "scratch-2", h))
}

// The plugin's allocation reads, blocking or not, and its waits for a
// slot's lock are read with their durations (hclog's float nanoseconds);
// listReads counts the reads within a batch's window.
func TestChurnLogReadsAndLockWaits(t *testing.T) {
	const log = `    2026-11-24T21:29:13.151Z [TRACE] client.device_mgr.nomad-device-zfs: read the node's allocations: plugin=nomad-device-zfs @module=nomad-device-zfs.allocwatch allocs=132 blocking=true index=887 took="2.2466715e+08" timestamp=2026-11-24T21:29:13.151Z
    2026-11-24T21:29:13.274Z [TRACE] client.device_mgr.nomad-device-zfs: read the node's allocations: plugin=nomad-device-zfs @module=nomad-device-zfs.allocwatch allocs=135 blocking=false index=892 took="1.5074066e+07" timestamp=2026-11-24T21:29:13.274Z
    2026-11-24T21:29:13.290Z [TRACE] client.device_mgr.nomad-device-zfs: waited for the slot's lock: plugin=nomad-device-zfs @module=nomad-device-zfs.slots device=scratch-1 for="hand over the spare" behind=sync waited="4.2e+06" timestamp=2026-11-24T21:29:13.290Z
`
	lg, err := readChurnLog(strings.NewReader(log), "p/nomad", "scratch")
	must.NoError(t, err)
	must.Len(t, 2, lg.Reads)
	must.Eq(t, logRead{End: lg.Reads[0].End, Took: 224667150 * time.Nanosecond, Allocs: 132, Blocking: true}, lg.Reads[0])
	must.Eq(t, logRead{End: lg.Reads[1].End, Took: 15074066 * time.Nanosecond, Allocs: 135}, lg.Reads[1])
	for _, tc := range []struct {
		from, to string
		n, most  int
	}{
		{from: "21:29:13.000", to: "21:29:14.000", n: 2, most: 135},
		{from: "21:29:13.000", to: "21:29:13.200", n: 1, most: 132},
		{from: "21:29:13.200", to: "21:29:14.000", n: 1, most: 135},
		{from: "21:29:14.000", to: "21:29:15.000"},
	} {
		at := func(s string) time.Time {
			v, err := time.Parse(time.RFC3339Nano, "2026-11-24T"+s+"Z")
			must.NoError(t, err)
			return v
		}
		n, most := listReads(lg.Reads, at(tc.from), at(tc.to))
		must.Eq(t, [2]int{tc.n, tc.most}, [2]int{n, most}, must.Sprintf("%s to %s", tc.from, tc.to))
	}
	must.Len(t, 1, lg.LockWaits)
	must.Eq(t, logLockWait{At: lg.LockWaits[0].At, For: "hand over the spare", Behind: "sync", Waited: 4200 * time.Microsecond}, lg.LockWaits[0])
	must.StrContains(t, lockWaitsNote(lg.LockWaits), "behind: sync 1")
}
