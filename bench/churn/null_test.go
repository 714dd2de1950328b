package churn

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/bench"
	"github.com/nomad-device-zfs/nomad-device-zfs/bench/nulldevice"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadplugin"
)

// The null plugin takes the churn's block, offers one device per slot
// under the name the null jobs ask for, and gives them the variable the
// device jobs' script writes through.
func TestNullConfig(t *testing.T) {
	dir := t.TempDir()
	conn, stop, err := nomadplugin.Connect(nulldevice.New(hclog.NewNullLogger()))
	must.NoError(t, err)
	t.Cleanup(stop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must.NoError(t, bench.Configure(ctx, conn, nullConfigBlock(dir, 4)))
	must.StrContains(t, nullConfig(dir, 4), `plugin "nomad-device-null" {`)

	job := churnJob("j", kindNull)
	task := job.TaskGroups[0].Tasks[0]
	must.SliceLen(t, 1, task.Resources.Devices)
	must.Eq(t, "nullbench/dataset/null", task.Resources.Devices[0].Name)
	script := task.Config["args"].([]string)[1]
	must.StrContains(t, script, `"$ZFS_SCRATCH_PATH/f" &&`, must.Sprint("the job writes through the slot's variable, and fails when it cannot"))
	for i := range 4 {
		id := "null-" + string(rune('0'+i))
		res, err := bench.Reserve(ctx, conn, id)
		must.NoError(t, err)
		// What a slot of the class "scratch" gives a task: its variable
		// and its default mount path (docs/configuration.md).
		must.Eq(t, map[string]string{"ZFS_SCRATCH_PATH": "/zfs/scratch"}, res.GetEnvs())
		must.SliceLen(t, 1, res.GetMounts())
		must.Eq(t, "/zfs/scratch", res.GetMounts()[0].GetTaskPath())
		must.Eq(t, filepath.Join(dir, id), res.GetMounts()[0].GetHostPath())
	}
	_, err = bench.Reserve(ctx, conn, "null-4")
	must.Error(t, err)
	// The device job is the same but for the device it asks for.
	dev := churnJob("j", kindDevice).TaskGroups[0].Tasks[0]
	must.Eq(t, script, dev.Config["args"].([]string)[1])
	must.Eq(t, "zfs/dataset/"+churnClass, dev.Resources.Devices[0].Name)
	must.SliceEmpty(t, churnJob("j", kindBaseline).TaskGroups[0].Tasks[0].Resources.Devices)
}

// nullBatch is a batch whose allocation i was placed at t0 + i seconds
// (so the first slots are the first wave) with a devices hook of
// reserve[i] ms; how[i] says how the plugin handed it over.
func nullBatch(kind string, t0 time.Time, reserve []float64, how []string) BatchResult {
	b := BatchResult{Kind: kind, Seconds: 10}
	for i := range reserve {
		a := AllocRecord{Job: kind + string(rune('a'+i)), AllocID: kind + "-" + string(rune('a'+i)), Placed: t0.Add(time.Duration(i) * time.Second), ReserveMS: reserve[i]}
		if how != nil {
			a.How, a.Fresh = how[i], how[i] == "fresh"
		}
		b.Allocs = append(b.Allocs, a)
	}
	return b
}

func TestNullRows(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC)
	idle := func(ms ...float64) []AllocRecord {
		var out []AllocRecord
		for _, v := range ms {
			out = append(out, AllocRecord{ReserveMS: v})
		}
		return out
	}
	res := &Results{Slots: 2,
		Idle:     idle(2, 2, 2),
		IdleNull: idle(0.5, 0.5, 1),
		Batches: []BatchResult{
			nullBatch(kindBaseline, t0, []float64{0, 0, 0, 0}, nil),
			nullBatch(kindDevice, t0, []float64{30, 10, 6, 8}, []string{"fresh", "fresh", "spare", "spare"}),
		},
		Null: []BatchResult{nullBatch(kindNull, t0, []float64{4, 2, 1, 0.5}, nil)},
	}
	res.Batches[1].Seconds = 12.5
	res.Null[0].Seconds = 8
	rows := nullRows(res)
	must.SliceLen(t, 3, rows)

	wave, rest, thr := rows[0], rows[1], rows[2]
	must.Eq(t, "null-reserve-wave", wave.Key)
	must.Eq(t, "3.0 ms", wave.Measured) // p50 of 4 and 2
	must.Eq(t, "0.5 ms idle", wave.Reference)
	must.Eq(t, "6.00×", wave.Ratio)
	must.Eq(t, "info", wave.Verdict)
	// The plugin's first wave: p50 of 30 and 10 = 20 ms, 6.67× the null's.
	must.StrContains(t, wave.Note, "would read about 6.00× there (2 and 3 samples)")
	must.StrContains(t, wave.Note, "took p50 20.0 ms (all of its first waves, 2; its fresh ones 20.0 ms, 2), 6.67× the null's; idle, the plugin's 2.0 ms is 4.00× the null's")

	must.Eq(t, "null-reserve-rest", rest.Key)
	must.Eq(t, "0.8 ms", rest.Measured) // p50 of 1 and 0.5
	must.Eq(t, "1.50×", rest.Ratio)
	must.StrContains(t, rest.Note, "took p50 7.0 ms (2; its spare ones 7.0 ms, 2), 9.33× the null's")

	must.Eq(t, "null-throughput", thr.Key)
	must.Eq(t, "0.50 jobs/s", thr.Measured)  // 4 jobs in 8 s
	must.Eq(t, "0.40 jobs/s", thr.Reference) // 4 in 10 s
	must.Eq(t, "1.25", thr.Ratio)

	// The plugin's own rows read none of the control's figures: the same
	// with and without them.
	with := churnRows(res)
	nullData, idleNull := res.Null, res.IdleNull
	res.Null, res.IdleNull = nil, nil
	without := churnRows(res)
	var own []Row
	for _, r := range with {
		if !strings.HasPrefix(r.Key, "null-") {
			own = append(own, r)
		}
	}
	must.Eq(t, without, own)
	must.SliceLen(t, len(without)+6, with, must.Sprint("three control rows, three judged against them"))

	// No null batch, or no idle null job: no control rows.
	must.SliceEmpty(t, nullRows(res))
	res.Null = nullData
	must.SliceEmpty(t, nullRows(res))
	res.Null, res.IdleNull = nil, idleNull
	must.SliceEmpty(t, nullRows(res))
}

// The plugin judged against the control at the same moments (issue 46):
// its first waves' and later Reserves against the null device's, and its
// throughput against the null device's, each with its target.
func TestControlRows(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name           string
		device, null   []float64 // devices hooks, ms; the first 2 are the first wave
		devSec, nulSec float64
		ratios         [3]string
		verdicts       [3]string
	}{
		{"all within", []float64{6, 4, 2, 2}, []float64{4, 4, 2, 2}, 10, 10.4,
			[3]string{"1.25×", "1.00×", "1.04"}, [3]string{"pass", "pass", "pass"}},
		{"a slow first wave, less throughput", []float64{30, 10, 3, 3}, []float64{4, 2, 2, 2}, 12.5, 10,
			[3]string{"6.67×", "1.50×", "0.80"}, [3]string{"miss", "pass", "miss"}},
		{"slow after the wave", []float64{3, 3, 4, 4}, []float64{3, 3, 2, 2}, 10, 10,
			[3]string{"1.00×", "2.00×", "1.00"}, [3]string{"pass", "miss", "pass"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &Results{Slots: 2,
				Batches: []BatchResult{nullBatch(kindDevice, t0, tc.device, nil)},
				Null:    []BatchResult{nullBatch(kindNull, t0, tc.null, nil)},
			}
			res.Batches[0].Seconds, res.Null[0].Seconds = tc.devSec, tc.nulSec
			rows := controlRows(res)
			must.SliceLen(t, 3, rows)
			for i, key := range []string{"null-judged-wave", "null-judged-rest", "null-judged-throughput"} {
				must.Eq(t, key, rows[i].Key)
				must.Eq(t, tc.ratios[i], rows[i].Ratio, must.Sprint(key))
				must.Eq(t, tc.verdicts[i], rows[i].Verdict, must.Sprint(key))
			}
			must.Eq(t, "≤ 1.5× the control", rows[0].Target)
			must.Eq(t, "≥ 0.95", rows[2].Target)
		})
	}
	// No control: no judged rows.
	must.SliceEmpty(t, controlRows(&Results{Slots: 2, Batches: []BatchResult{nullBatch(kindDevice, t0, []float64{1, 1, 1}, nil)}}))
}
