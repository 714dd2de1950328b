package preps

import (
	"errors"
	"testing"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/shoenig/test/must"
)

// TestRecord: a slot has at most one preparation; none starts while a
// Reserve of it is under way (Claim or Begin, until its End); a
// preparation is dropped only while it is still the slot's; only the
// finished, successful ones decided before a view are candidates to void.
func TestRecord(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := record.Owner{AllocID: "a", Task: "t"}
	b := record.Owner{AllocID: "b", Task: "t"}
	cases := []struct {
		name string
		run  func(t *testing.T, r *Record)
	}{
		{name: "one preparation a slot", run: func(t *testing.T, r *Record) {
			p := New(a, Fresh, t0)
			must.True(t, r.Start("s0", p))
			must.False(t, r.Start("s0", New(b, Fresh, t0)), must.Sprint("the slot has one"))
			must.EqOp(t, p, r.Of("s0"))
			must.True(t, r.Start("s1", New(b, Spare, t0)), must.Sprint("another slot"))
		}},
		{name: "a claim takes the preparations and holds off new ones until released", run: func(t *testing.T, r *Record) {
			p := New(a, Fresh, t0)
			must.True(t, r.Start("s0", p))
			ps, ok, release := r.Claim([]string{"s0", "s1"})
			must.False(t, ok, must.Sprint("s1 has none"))
			must.Eq(t, []*Prep{p, nil}, ps)
			must.Nil(t, r.Of("s0"))
			must.False(t, r.Start("s0", New(b, Fresh, t0)), must.Sprint("a Reserve of s0 is under way"))
			must.False(t, r.Start("s1", New(b, Fresh, t0)), must.Sprint("a Reserve of s1 is under way"))
			release()
			must.True(t, r.Start("s0", New(b, Fresh, t0)))
		}},
		{name: "begin and end nest with a claim", run: func(t *testing.T, r *Record) {
			_, _, release := r.Claim([]string{"s0"})
			r.Begin([]string{"s0"})
			release()
			must.False(t, r.Start("s0", New(a, Fresh, t0)), must.Sprint("the proof's Begin still holds"))
			r.End([]string{"s0"})
			must.True(t, r.Start("s0", New(a, Fresh, t0)))
		}},
		{name: "drop only the slot's own", run: func(t *testing.T, r *Record) {
			p, q := New(a, Fresh, t0), New(b, Fresh, t0)
			must.True(t, r.Start("s0", p))
			must.False(t, r.Drop("s0", q))
			must.EqOp(t, p, r.Of("s0"))
			must.True(t, r.Drop("s0", p))
			must.Nil(t, r.Of("s0"))
			must.False(t, r.Drop("s0", p), must.Sprint("gone already"))
		}},
		{name: "finished before a view: done, no error, began before it", run: func(t *testing.T, r *Record) {
			ok, failed, running, late := New(a, Fresh, t0), New(a, Fresh, t0), New(a, Fresh, t0), New(a, Fresh, t0.Add(time.Second))
			for id, p := range map[string]*Prep{"ok": ok, "failed": failed, "running": running, "late": late} {
				must.True(t, r.Start(id, p))
			}
			ok.Finish("pool/ok", true, nil)
			failed.Finish("", false, errors.New("zfs failed"))
			late.Finish("pool/late", false, nil)
			got := r.FinishedBefore(t0.Add(time.Second))
			must.MapLen(t, 1, got)
			must.EqOp(t, ok, got["ok"])
			must.EqOp(t, "pool/ok", got["ok"].Dataset)
			must.True(t, got["ok"].Armed)
			done, err := running.Finished()
			must.False(t, done)
			must.NoError(t, err)
			done, err = failed.Finished()
			must.True(t, done)
			must.Error(t, err)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, NewRecord())
		})
	}
}
