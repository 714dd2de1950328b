package device

import (
	"testing"

	"github.com/shoenig/test/must"

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
