package device

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

func TestArchivesMeta(t *testing.T) {
	a := func(ns, job, group string, index int) retention.Archive {
		return retention.Archive{Identity: retention.Identity{Namespace: ns, Job: job, Group: group, Task: "t", Index: index, Class: "state"}}
	}
	cases := []struct {
		name     string
		archives []retention.Archive
		want     string
	}{
		{"none", nil, ""},
		{"one group per job group, sorted", []retention.Archive{a("default", "web", "g", 0), a("default", "web", "g", 1), a("batch", "etl", "load", 0)}, "batch/etl/load,default/web/g"},
		{"unknown owners and commas left out", []retention.Archive{{Identity: retention.Identity{Unknown: true}}, a("default", "a,b", "g", 0), a("default", "db", "g", 0)}, "default/db/g"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, archivesMeta(tc.archives))
		})
	}
}

// setterFunc is a fake of the node metadata API: a 403 is a fault the
// real agent shows only with ACLs (the e2e ACL test runs with a token
// without node:write).
type setterFunc func(map[string]*string) error

func (f setterFunc) SetNodeMeta(_ context.Context, m map[string]*string) error { return f(m) }

// TestMetaPublisher runs in a synctest bubble: time is fake, so the
// back-off is the plugin's own, and synctest.Wait says when Run has
// nothing left to do.
func TestMetaPublisher(t *testing.T) {
	arch := []retention.Archive{{Identity: retention.Identity{Namespace: "default", Job: "db", Group: "g"}}}
	cases := []struct {
		name      string
		err       error
		wantCalls int32
	}{
		{"published once per change", nil, 2},
		{"no permission: tried once, then not within the back-off", allocwatch.ErrPermission, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int32
				got := make(chan map[string]*string, 10)
				m := newMetaPublisher(hclog.NewNullLogger())
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go m.Run(ctx, setterFunc(func(v map[string]*string) error {
					calls.Add(1)
					got <- v
					return tc.err
				}), RetentionPeriod, MetaDeniedBackoff)
				m.Update(arch)
				first := <-got
				must.Eq(t, "default/db/g", *first[ArchivesMetaKey])
				m.Update(arch) // unchanged: no call
				m.Update(nil)  // emptied: the key is removed (when allowed)
				time.Sleep(MetaDeniedBackoff - time.Second)
				synctest.Wait()
				must.Eq(t, tc.wantCalls, calls.Load())
				if tc.wantCalls == 2 {
					must.Nil(t, (<-got)[ArchivesMetaKey])
				}
			})
		})
	}
}

// TestMetaPublisher_OneWritePerGap: a churn of changes (every release adds
// a job group) is written at most once per MetaGap, each write the latest
// value, and the last change is written within MetaGap of the write
// before it; a change after a quiet MetaGap goes out at once. Each write
// is a node update on Nomad's servers (see MetaGap).
func TestMetaPublisher_OneWritePerGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu   sync.Mutex // guards sent, at
			sent []string
			at   []time.Time
		)
		api := setterFunc(func(v map[string]*string) error {
			mu.Lock()
			defer mu.Unlock()
			val := "-" // a removal
			if p := v[ArchivesMetaKey]; p != nil {
				val = *p
			}
			sent, at = append(sent, val), append(at, time.Now())
			return nil
		})
		calls := func() ([]string, []time.Time) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(sent), slices.Clone(at)
		}
		m := newMetaPublisher(hclog.NewNullLogger())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go m.Run(ctx, api, RetentionPeriod, MetaDeniedBackoff)
		start := time.Now()
		var jobs []retention.Archive
		// A release at once, then every 2 s from 1 s on (1 s, 3 s, ... 67 s),
		// each adding a job group: none at the moment a write is due.
		for i := range 35 {
			if i > 0 {
				time.Sleep(time.Until(start.Add(time.Duration(2*i-1) * time.Second)))
			}
			jobs = append(jobs, retention.Archive{Identity: retention.Identity{Namespace: "default", Job: fmt.Sprintf("j%02d", i), Group: "g"}})
			m.Update(jobs)
			synctest.Wait()
		}
		last := archivesMeta(jobs)
		time.Sleep(MetaGap)
		synctest.Wait()
		got, when := calls()
		must.Eq(t, []time.Duration{0, MetaGap, 2 * MetaGap, 3 * MetaGap}, offsets(start, when), must.Sprint("the first change at once, then one write per MetaGap"))
		must.Eq(t, "default/j00/g", got[0])
		must.Eq(t, archivesMeta(jobs[:16]), got[1], must.Sprint("the latest value at the write"))
		must.Eq(t, last, got[len(got)-1], must.Sprint("the last change is written"))

		// Quiet for MetaGap: the next change goes out at once.
		time.Sleep(MetaGap)
		changed := time.Now()
		m.Update(nil)
		synctest.Wait()
		got, when = calls()
		must.Eq(t, 5, len(got))
		must.Eq(t, "-", got[4])
		must.Eq(t, changed, when[4], must.Sprint("at once after a quiet MetaGap"))
	})
}

// offsets returns each of ts less start.
func offsets(start time.Time, ts []time.Time) []time.Duration {
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(start)
	}
	return out
}

// logCounter counts an hclog JSON logger's lines by level.
type logCounter struct {
	mu     sync.Mutex // guards levels
	levels map[string]int
}

func (c *logCounter) Write(b []byte) (int, error) {
	var line struct {
		Level string `json:"@level"`
	}
	if err := json.Unmarshal(b, &line); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.levels[line.Level]++
	return len(b), nil
}

func (c *logCounter) count(level string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.levels[level]
}

// A refusal (403: no node:write) is not remembered until a restart: the
// publisher tries again after the back-off, warns once per streak of
// refusals, and says when it succeeds again.
func TestMetaPublisher_RefusalIsRetriedAfterTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The API's answers, in order: refused, refused, then allowed; a
		// later refusal starts a new streak.
		answers := []error{allocwatch.ErrPermission, allocwatch.ErrPermission, nil, nil, allocwatch.ErrPermission}
		var (
			mu   sync.Mutex // guards sent
			sent []string   // the values of every call, "-" for a removal
		)
		calls := func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(sent)
		}
		api := setterFunc(func(v map[string]*string) error {
			mu.Lock()
			defer mu.Unlock()
			val := "-"
			if p := v[ArchivesMetaKey]; p != nil {
				val = *p
			}
			sent = append(sent, val)
			return answers[len(sent)-1]
		})
		logs := &logCounter{levels: map[string]int{}}
		m := newMetaPublisher(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug, JSONFormat: true}))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go m.Run(ctx, api, RetentionPeriod, MetaDeniedBackoff)
		group := func(job string) []retention.Archive {
			return []retention.Archive{{Identity: retention.Identity{Namespace: "default", Job: job, Group: "g"}}}
		}

		m.Update(group("a"))
		synctest.Wait()
		must.Eq(t, []string{"default/a/g"}, calls(), must.Sprint("the first value is sent, and refused"))
		must.Eq(t, 1, logs.count("warn"))

		m.Update(group("b")) // a new value within the back-off waits for it
		time.Sleep(MetaDeniedBackoff - time.Second)
		synctest.Wait()
		must.Eq(t, []string{"default/a/g"}, calls(), must.Sprint("no call within the back-off, though the value changed"))

		time.Sleep(2 * time.Second)
		synctest.Wait()
		must.Eq(t, []string{"default/a/g", "default/b/g"}, calls(), must.Sprint("tried again after the back-off, with the latest value"))
		must.Eq(t, 1, logs.count("warn"), must.Sprint("one warning per streak of refusals"))
		must.Eq(t, 0, logs.count("info"))

		time.Sleep(MetaDeniedBackoff)
		synctest.Wait()
		must.Eq(t, []string{"default/a/g", "default/b/g", "default/b/g"}, calls(), must.Sprint("tried again after a second back-off, and allowed"))
		must.Eq(t, 1, logs.count("info"), must.Sprint("success after refusals is said once"))

		m.Update(nil) // allowed now: a change goes out MetaGap after the last write
		synctest.Wait()
		must.Eq(t, []string{"default/a/g", "default/b/g", "default/b/g"}, calls())
		time.Sleep(MetaGap)
		synctest.Wait()
		must.Eq(t, []string{"default/a/g", "default/b/g", "default/b/g", "-"}, calls())

		m.Update(group("c")) // refused again: a new streak, a new warning
		time.Sleep(MetaGap)
		synctest.Wait()
		must.Eq(t, []string{"default/a/g", "default/b/g", "default/b/g", "-", "default/c/g"}, calls())
		must.Eq(t, 2, logs.count("warn"))
		must.Eq(t, 1, logs.count("info"))
	})
}
