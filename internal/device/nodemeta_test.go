package device

import (
	"context"
	"sync/atomic"
	"testing"
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

func TestMetaPublisher(t *testing.T) {
	arch := []retention.Archive{{Identity: retention.Identity{Namespace: "default", Job: "db", Group: "g"}}}
	cases := []struct {
		name      string
		err       error
		wantCalls int32
	}{
		{"published once per change", nil, 2},
		{"no permission: tried once, then left", allocwatch.ErrPermission, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			got := make(chan map[string]*string, 10)
			m := newMetaPublisher(hclog.NewNullLogger())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go m.Run(ctx, setterFunc(func(v map[string]*string) error {
				calls.Add(1)
				got <- v
				return tc.err
			}), time.Hour)
			m.Update(arch)
			first := <-got
			must.Eq(t, "default/db/g", *first[ArchivesMetaKey])
			m.Update(arch) // unchanged: no call
			m.Update(nil)  // emptied: the key is removed (when allowed)
			time.Sleep(200 * time.Millisecond)
			must.Eq(t, tc.wantCalls, calls.Load())
			if tc.wantCalls == 2 {
				must.Nil(t, (<-got)[ArchivesMetaKey])
			}
		})
	}
}
