package retention

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	web := Identity{Namespace: "default", Job: "web", Group: "g", Task: "t", Index: 0, Class: "state"}
	web1 := web
	web1.Index = 1
	db := Identity{Namespace: "default", Job: "db", Group: "g", Task: "t", Index: 0, Class: "state"}
	gone := Identity{Namespace: "default", Job: "web", Group: "g", Task: "t", Index: 0, Class: "removed"}
	unknown := Identity{Class: "state", Index: -1, Unknown: true, Slot: 0}
	// arch makes an archive of id released hoursAgo, using mib MiB.
	arch := func(id Identity, hoursAgo, mib int) Archive {
		at := now.Add(-time.Duration(hoursAgo) * time.Hour)
		name := fmt.Sprintf("p/.archive/%s-%d.%s.%s", id.Class, id.Slot, id.Job, at.Format("20060102T150405Z"))
		alloc := name // one allocation per archive, unless a case says otherwise
		if id.Unknown {
			alloc = ""
		}
		return Archive{Name: name, AllocID: alloc,
			Class: id.Class, Slot: id.Slot, Identity: id, ReleasedAt: at, UsedBytes: uint64(mib) << 20}
	}
	// sent marks a as in backup_dir.
	sent := func(a Archive) Archive {
		a.Backup = "1234"
		return a
	}
	keep2 := Rules{Classes: map[string]Policy{"state": {Keep: 2}}, Default: Policy{Keep: DefaultKeep}}

	cases := []struct {
		name     string
		archives []Archive
		used     uint64 // MiB; the sum of the archives when 0
		rules    Rules
		want     []string // names pruned, oldest first
		rules2   []string // the rule of each
	}{
		{
			name:     "keep the newest per identity",
			archives: []Archive{arch(web, 1, 1), arch(web, 2, 1), arch(web, 3, 1), arch(web, 4, 1), arch(db, 5, 1), arch(web1, 6, 1)},
			rules:    keep2,
			want:     []string{arch(web, 4, 1).Name, arch(web, 3, 1).Name},
			rules2:   []string{"keep", "keep"},
		},
		{
			name:     "max_age prunes old ones, keep still bounds the rest",
			archives: []Archive{arch(web, 1, 1), arch(web, 30, 1), arch(db, 50, 1)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 3, MaxAge: 24 * time.Hour}}},
			want:     []string{arch(db, 50, 1).Name, arch(web, 30, 1).Name},
			rules2:   []string{"max_age", "max_age"},
		},
		{
			name:     "an archive not in backup_dir yet is pruned by no rule",
			archives: []Archive{arch(web, 1, 4), sent(arch(web, 2, 4)), arch(web, 3, 4), sent(arch(web, 40, 4)), arch(web, 50, 4), arch(unknown, 60, 4)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 1, MaxAge: 24 * time.Hour, Backup: true}}, Quota: 10 << 20},
			want:     []string{arch(unknown, 60, 4).Name, sent(arch(web, 40, 4)).Name, sent(arch(web, 2, 4)).Name},
			rules2:   []string{"max_age", "keep", "keep"}, // and archive_quota prunes none of the rest
		},
		{
			name:     "a release time in the future is never too old",
			archives: []Archive{arch(web, -5, 1)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 1, MaxAge: time.Hour}}},
		},
		{
			name:     "classes no longer configured follow the default",
			archives: []Archive{arch(gone, 1, 1), arch(gone, 2, 1), arch(gone, 3, 1), arch(gone, 4, 1)},
			rules:    keep2,
			want:     []string{arch(gone, 4, 1).Name},
			rules2:   []string{"keep"},
		},
		{
			name:     "unknown owners are grouped by slot",
			archives: []Archive{arch(unknown, 1, 1), arch(unknown, 2, 1), arch(unknown, 3, 1)},
			rules:    keep2,
			want:     []string{arch(unknown, 3, 1).Name},
			rules2:   []string{"keep"},
		},
		{
			name:     "archive_quota prunes the oldest until the next archive fits",
			archives: []Archive{arch(web, 1, 10), arch(db, 2, 10), arch(web1, 3, 10), arch(db, 4, 10)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 5}}, Quota: 40 << 20, Headroom: 15 << 20},
			want:     []string{arch(db, 4, 10).Name, arch(web1, 3, 10).Name},
			rules2:   []string{"archive_quota", "archive_quota"},
		},
		{
			name:     "what keep prunes counts toward the quota",
			archives: []Archive{arch(web, 1, 10), arch(web, 2, 10), arch(db, 3, 10)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 1}}, Quota: 30 << 20, Headroom: 10 << 20},
			want:     []string{arch(web, 2, 10).Name},
			rules2:   []string{"keep"},
		},
		{
			name:     "the container's own use counts",
			archives: []Archive{arch(web, 1, 10), arch(db, 2, 10)},
			used:     25,
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 5}}, Quota: 30 << 20, Headroom: 10 << 20},
			want:     []string{arch(db, 2, 10).Name},
			rules2:   []string{"archive_quota"},
		},
		{
			name:     "a quota nothing can meet prunes everything",
			archives: []Archive{arch(web, 1, 10)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 5}}, Quota: 12 << 20, Headroom: 10 << 20},
			want:     []string{arch(web, 1, 10).Name},
			rules2:   []string{"archive_quota"},
		},
		{
			name: "an allocation's archives (one per device) are kept together",
			archives: func() []Archive {
				a0, a1 := arch(web, 1, 1), arch(web, 1, 1)
				a1.Name, a1.Slot = a1.Name+"-dev1", 1
				a1.AllocID = a0.AllocID
				return []Archive{a0, a1, arch(web, 2, 1)}
			}(),
			rules:  Rules{Classes: map[string]Policy{"state": {Keep: 1}}},
			want:   []string{arch(web, 2, 1).Name},
			rules2: []string{"keep"},
		},
		{
			name:     "keep below one keeps one",
			archives: []Archive{arch(web, 1, 1), arch(web, 2, 1)},
			rules:    Rules{Classes: map[string]Policy{"state": {Keep: 0}}},
			want:     []string{arch(web, 2, 1).Name},
			rules2:   []string{"keep"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			used := tc.used << 20
			if tc.used == 0 {
				for _, a := range tc.archives {
					used += a.UsedBytes
				}
			}
			got := Plan(tc.archives, used, tc.rules, now)
			var names, rules []string
			for _, p := range got {
				names = append(names, p.Archive.Name)
				rules = append(rules, p.Rule)
				must.NotEq(t, "", p.Reason)
			}
			must.Eq(t, tc.want, names)
			must.Eq(t, tc.rules2, rules)
		})
	}
}

// HeldForBackup: a prune the rules call for but for the archive's not
// being in backup_dir yet; not an unsent archive the rules keep anyway.
func TestHeldForBackup(t *testing.T) {
	now := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	web := Identity{Namespace: "default", Job: "web", Group: "g", Task: "t", Index: 0, Class: "state"}
	arch := func(hoursAgo int, sent bool) Archive {
		at := now.Add(-time.Duration(hoursAgo) * time.Hour)
		name := fmt.Sprintf("p/.archive/state-0.web.%s", at.Format("20060102T150405Z"))
		a := Archive{Name: name, AllocID: name, Class: "state", Identity: web, ReleasedAt: at, UsedBytes: 1 << 20}
		if sent {
			a.Backup = "1234"
		}
		return a
	}
	unknown := func(hoursAgo int) Archive {
		a := arch(hoursAgo, false)
		a.AllocID, a.Identity = "", Identity{Class: "state", Index: -1, Unknown: true}
		return a
	}
	backup := func(keep int) Rules {
		return Rules{Classes: map[string]Policy{"state": {Keep: keep, Backup: true}}, Default: Policy{Keep: DefaultKeep}}
	}
	for _, tc := range []struct {
		name     string
		archives []Archive
		rules    Rules
		want     bool
	}{
		{"the older over keep, not sent yet", []Archive{arch(1, true), arch(2, false)}, backup(1), true},
		{"the older over keep, sent: planned, not held", []Archive{arch(1, false), arch(2, true)}, backup(1), false},
		{"not sent, within keep", []Archive{arch(1, false), arch(2, false)}, backup(2), false},
		{"no backup_dir: never held", []Archive{arch(1, false), arch(2, false)},
			Rules{Classes: map[string]Policy{"state": {Keep: 1}}}, false},
		{"a class no longer configured follows Default", []Archive{arch(1, false), arch(2, false)},
			Rules{Default: Policy{Keep: 1, Backup: true}}, true},
		{"past max_age, not sent yet", []Archive{arch(48, false)},
			Rules{Classes: map[string]Policy{"state": {Keep: 3, MaxAge: 24 * time.Hour, Backup: true}}}, true},
		{"an unknown owner is never held (the keeper sends none)", []Archive{unknown(1), unknown(2)}, backup(1), false},
		// With archive_quota the held plan prunes other, sent archives
		// instead: the unsent one is still held back.
		{"archive_quota: the oldest, not sent, held; a sent one pruned instead", []Archive{arch(1, true), arch(2, true), arch(3, false)},
			Rules{Classes: map[string]Policy{"state": {Keep: 3, Backup: true}}, Quota: 2 << 20}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := tc.rules
			classes := maps.Clone(rules.Classes)
			must.Eq(t, tc.want, HeldForBackup(tc.archives, uint64(len(tc.archives))<<20, tc.rules, now))
			must.Eq(t, rules.Default, tc.rules.Default, must.Sprint("the rules are left as they were"))
			must.Eq(t, classes, tc.rules.Classes, must.Sprint("the rules are left as they were"))
		})
	}
}
