package apply

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
)

// TestSplit: the class and archive containers' actions are tree-wide;
// a slot's actions, and those on a dataset in the archive that came from
// it, are that slot's.
func TestSplit(t *testing.T) {
	cfg := reconcile.Config{Parent: "tank/ndz"}
	cases := []struct {
		name string
		a    reconcile.Action
		slot string // "" for tree-wide
	}{
		{name: "class container", a: reconcile.Action{Kind: reconcile.CreateClass, Dataset: "tank/ndz/web", Class: "web", Index: -1}},
		{name: "archive container", a: reconcile.Action{Kind: reconcile.CreateArchive, Dataset: "tank/ndz/.archive", Index: -1}},
		{name: "a slot's dataset", a: reconcile.Action{Kind: reconcile.CreateSlot, Dataset: "tank/ndz/web/2", Class: "web", Index: 2}, slot: "web-2"},
		{name: "an archived dataset of a slot", a: reconcile.Action{Kind: reconcile.DestroyArchived, Dataset: record.ArchivedName(cfg.ArchiveDataset(), "web", 2, record.Owner{AllocID: "a1", Task: "t"}, time.Unix(1767225600, 0)), Index: -1}, slot: "web-2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tree, bySlot := Split(cfg, []reconcile.Action{tc.a})
			if tc.slot == "" {
				must.Eq(t, []reconcile.Action{tc.a}, tree)
				must.MapEmpty(t, bySlot)
				return
			}
			must.SliceEmpty(t, tree)
			must.Eq(t, map[string][]reconcile.Action{tc.slot: {tc.a}}, bySlot)
		})
	}
}

// TestDropFailed: actions on a dataset that failed in this Sync are not
// retried; the others keep their order.
func TestDropFailed(t *testing.T) {
	a := reconcile.Action{Kind: reconcile.Unmount, Dataset: "tank/ndz/web/0"}
	b := reconcile.Action{Kind: reconcile.CreateSlot, Dataset: "tank/ndz/web/1"}
	c := reconcile.Action{Kind: reconcile.SetQuota, Dataset: "tank/ndz/web/2"}
	cases := []struct {
		name   string
		failed map[string]string
		want   []reconcile.Action
	}{
		{name: "none failed", failed: map[string]string{}, want: []reconcile.Action{a, b, c}},
		{name: "one failed", failed: map[string]string{"tank/ndz/web/1": "busy"}, want: []reconcile.Action{a, c}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, DropFailed([]reconcile.Action{a, b, c}, tc.failed))
		})
	}
}
