package reconcile

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

// ds builds an observed dataset; props are name=value pairs set locally.
func ds(name string, props ...string) zfs.Dataset {
	d := zfs.Dataset{Name: name, Props: map[string]zfs.Prop{}}
	for i := 0; i+1 < len(props); i += 2 {
		d.Props[props[i]] = zfs.Prop{Value: props[i+1], Source: "local"}
	}
	return d
}

func inherited(d zfs.Dataset, prop, value, from string) zfs.Dataset {
	d.Props[prop] = zfs.Prop{Value: value, Source: "inherited from " + from}
	return d
}

func slotDS(name string, state record.State) zfs.Dataset {
	return ds(name, record.PropManaged, record.ManagedSlot, record.PropState, string(state), "refquota", "1048576", "mounted", "yes", "mountpoint", "/"+name)
}

func testConfig(slots int) Config {
	return Config{Parent: "tank/nomad", Classes: []Class{{Name: "scratch", Slots: slots, Quota: 1 << 20, Mode: 0o770}}}
}

type step struct {
	Kind    ActionKind
	Dataset string
}

func steps(p Plan) []step {
	var s []step
	for _, a := range p.Actions {
		s = append(s, step{a.Kind, a.Dataset})
	}
	return s
}

func TestMakePlan(t *testing.T) {
	parent := ds("tank/nomad")
	class := ds("tank/nomad/scratch", record.PropManaged, record.ManagedClass)
	arch := ds("tank/nomad/.archive", record.PropManaged, record.ManagedArchive)
	cases := []struct {
		name     string
		cfg      Config
		observed []zfs.Dataset
		want     []step
		foreign  []string
	}{
		{
			name:     "fresh parent: create class and every slot",
			cfg:      testConfig(2),
			observed: []zfs.Dataset{parent},
			want: []step{
				{CreateArchive, "tank/nomad/.archive"},
				{CreateClass, "tank/nomad/scratch"},
				{CreateSlot, "tank/nomad/scratch/0"},
				{CreateSlot, "tank/nomad/scratch/1"},
			},
		},
		{
			name: "everything exists: nothing to do",
			cfg:  testConfig(2),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				slotDS("tank/nomad/scratch/1", record.StateReserved), slotDS("tank/nomad/scratch/1.alt", record.StateFree)},
		},
		{
			name:     "a slot in use gets its spare under the name it does not use",
			cfg:      testConfig(2),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0.alt", record.StateReserved), slotDS("tank/nomad/scratch/1", record.StateReserved)},
			want:     []step{{CreateSlot, "tank/nomad/scratch/0"}, {CreateSlot, "tank/nomad/scratch/1.alt"}},
		},
		{
			name: "two fresh datasets: the alternate goes",
			cfg:  testConfig(1),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				slotDS("tank/nomad/scratch/0.alt", record.StateFree)},
			want: []step{{DestroySlot, "tank/nomad/scratch/0.alt"}},
		},
		{
			name: "a foreign alternate: no spare, and it is reported",
			cfg:  testConfig(1),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateReserved),
				ds("tank/nomad/scratch/0.alt")},
			foreign: []string{"tank/nomad/scratch/0.alt"},
		},
		{
			name: "two datasets in use: nothing is made or touched",
			cfg:  testConfig(1),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateReserved),
				slotDS("tank/nomad/scratch/0.alt", record.StateReserved)},
		},
		{
			name: "raise slots: create only the new one",
			cfg:  testConfig(3),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				slotDS("tank/nomad/scratch/1", record.StateReserved), slotDS("tank/nomad/scratch/1.alt", record.StateFree)},
			want: []step{{CreateSlot, "tank/nomad/scratch/2"}},
		},
		{
			name: "lower slots: destroy free surplus, keep the one in use",
			cfg:  testConfig(1),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateReserved), slotDS("tank/nomad/scratch/0.alt", record.StateFree),
				slotDS("tank/nomad/scratch/1", record.StateReserved), slotDS("tank/nomad/scratch/1.alt", record.StateFree), slotDS("tank/nomad/scratch/2", record.StateFree)},
			want: []step{{DestroySlot, "tank/nomad/scratch/1.alt"}, {DestroySlot, "tank/nomad/scratch/2"}},
		},
		{
			name: "unmanaged datasets are never touched",
			cfg:  testConfig(2),
			observed: []zfs.Dataset{parent, arch, class,
				inherited(ds("tank/nomad/scratch/0"), record.PropManaged, record.ManagedSlot, "tank/nomad/scratch"),
				ds("tank/nomad/scratch/1"),
				ds("tank/nomad/scratch/5"),
				ds("tank/nomad/scratch/data"),
				ds("tank/nomad/other")},
			foreign: []string{"tank/nomad/other", "tank/nomad/scratch/0", "tank/nomad/scratch/1", "tank/nomad/scratch/5", "tank/nomad/scratch/data"},
		},
		{
			name:     "a foreign dataset where the class goes: hands off",
			cfg:      testConfig(2),
			observed: []zfs.Dataset{parent, arch, ds("tank/nomad/scratch"), ds("tank/nomad/scratch/0")},
			foreign:  []string{"tank/nomad/scratch"},
		},
		{
			name: "class removed from config: its datasets are left alone",
			cfg:  Config{Parent: "tank/nomad", Classes: []Class{{Name: "fast", Slots: 1, Quota: 1 << 20}}},
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				ds("tank/nomad/fast", record.PropManaged, record.ManagedClass), slotDS("tank/nomad/fast/0", record.StateFree)},
			foreign: []string{"tank/nomad/scratch"},
		},
		{
			name: "quota changed: only free slots follow",
			cfg:  Config{Parent: "tank/nomad", Classes: []Class{{Name: "scratch", Slots: 2, Quota: 2 << 20}}},
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				slotDS("tank/nomad/scratch/1", record.StateReserved), slotDS("tank/nomad/scratch/1.alt", record.StateFree)},
			want: []step{{SetQuota, "tank/nomad/scratch/0"}, {SetQuota, "tank/nomad/scratch/1.alt"}},
		},
		{
			name:     "zero slots: destroy free, keep class",
			cfg:      testConfig(0),
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree)},
			want:     []step{{DestroySlot, "tank/nomad/scratch/0"}},
		},
	}
	now := time.Date(2026, 11, 21, 14, 30, 0, 0, time.UTC)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := MakePlan(tc.cfg, tc.observed, now)
			must.Eq(t, tc.want, steps(p))
			must.Eq(t, tc.foreign, p.Foreign)
		})
	}
}

func TestSlotProps(t *testing.T) {
	c := Class{Name: "scratch", Quota: 10 << 30, Properties: map[string]string{"compression": "lz4", "setuid": "on"}}
	must.Eq(t, map[string]string{
		"compression":      "lz4",
		"setuid":           "on",
		"devices":          "off",
		"refquota":         "10737418240",
		record.PropManaged: record.ManagedSlot,
		record.PropState:   "free",
	}, c.SlotProps())
}

func TestMakePlan_Release(t *testing.T) {
	now := time.Date(2026, 11, 21, 14, 30, 0, 0, time.UTC)
	parent := ds("tank/nomad")
	class := ds("tank/nomad/scratch", record.PropManaged, record.ManagedClass)
	arch := ds("tank/nomad/.archive", record.PropManaged, record.ManagedArchive)
	owned := func(d zfs.Dataset, kv ...string) zfs.Dataset {
		props := []string{record.PropOwner, record.Owner{AllocID: "0b1c2d3e-aaaa-bbbb-cccc-000000000000", Namespace: "default",
			Job: "web app", Group: "g", Task: "t"}.Encode()}
		for i := 0; i+1 < len(props); i += 2 {
			d.Props[props[i]] = zfs.Prop{Value: props[i+1], Source: "local"}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Props[kv[i]] = zfs.Prop{Value: kv[i+1], Source: "local"}
		}
		return d
	}
	leaf := "tank/nomad/.archive/scratch-1.default.web_app.g.t.0b1c2d3e.20261121T143000Z"
	type act struct {
		Kind                     ActionKind
		Dataset, Prop, Value, To string
	}
	// On a ZFS whose rename unmounts (OpenZFS): the archive mounts
	// nothing, and the slot's mountpoint follows its name.
	archNone := ds("tank/nomad/.archive", record.PropManaged, record.ManagedArchive, "mountpoint", "none")
	following := func(name string, kv ...string) zfs.Dataset {
		d := owned(ds(name, record.PropManaged, record.ManagedSlot, record.PropState, string(record.StateArchived), "refquota", "1048576"), kv...)
		return inherited(d, "mountpoint", "/"+name, "tank/nomad")
	}
	// unmountedFirst: the whole release of scratch/1, mounted, that is
	// not a rename into an archive that mounts nothing: its unmount
	// (`zfs set canmount=off`, one process) and the rename.
	unmountedFirst := []act{
		{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""},
		{Unmount, "tank/nomad/scratch/1", "", "", ""},
		{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf},
	}
	cases := []struct {
		name     string
		slots    int
		observed []zfs.Dataset
		want     []act
		// renameUnmounts: Config.RenameUnmounts.
		renameUnmounts bool
	}{
		{
			name:  "release begun by an earlier version (releasing): a fresh dataset beside it at once, its fate first, every step",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateReleasing), "canmount", "on")},
			want: []act{
				{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""},
				{SetProp, "tank/nomad/scratch/1", record.PropState, "archived", ""},
				{Unmount, "tank/nomad/scratch/1", "", "", ""},
				{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf},
			},
		},
		{
			name:  "resumed after an unmount whose canmount did not land (a stop within the command, or an earlier build's stop between its unmount and canmount=noauto): canmount=off, which mounts nothing, then the rename",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "on", "mounted", "no")},
			want: []act{
				{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""},
				{SetProp, "tank/nomad/scratch/1", "canmount", "off", ""},
				{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf},
			},
		},
		{
			name:  "an earlier build's archive-bound dataset set canmount=noauto but still mounted: unmounted (canmount=off), then the rename",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "noauto", "mounted", "yes")},
			want: unmountedFirst,
		},
		{
			name:  "release begun by this version (fate archived): no state step",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "on", "mounted", "yes")},
			want: unmountedFirst,
		},
		{
			name:  "resumed after the unmount: rename with the recorded time",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "noauto", "mounted", "no",
					record.PropReleasedAt, "2026-11-21T14:30:00Z")},
			want: []act{
				{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""},
				{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf},
			},
		},
		{
			name:  "resumed after the rename: new slot, archive marked archived",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS(leaf, record.StateReleasing), "mounted", "no")},
			want: []act{
				{CreateSlot, "tank/nomad/scratch/1", "", "", ""},
				{SetProp, leaf, record.PropState, "archived", ""},
			},
		},
		{
			name:  "released beside its spare: the name is not made again (the spare serves)",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "noauto", "mounted", "no", record.PropReleasedAt, "2026-11-21T14:30:00Z"),
				slotDS("tank/nomad/scratch/1.alt", record.StateFree)},
			want: []act{{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf}},
		},
		{
			name:  "released beside the dataset in use: the name is made again as the spare",
			slots: 2,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				slotDS("tank/nomad/scratch/1", record.StateReserved),
				owned(slotDS("tank/nomad/scratch/1.alt", record.StateArchived), "canmount", "noauto", "mounted", "no", record.PropReleasedAt, "2026-11-21T14:30:00Z")},
			want: []act{
				{RenameToArchive, "tank/nomad/scratch/1.alt", "", "", leaf},
				{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""},
			},
		},
		{
			name:     "on_release destroy: the archived copy is destroyed",
			slots:    1,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree), owned(slotDS(leaf, record.StateDestroying))},
			want:     []act{{DestroyArchived, leaf, "", "", ""}},
		},
		{
			name:     "archived datasets are left as they are",
			slots:    1,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree), owned(slotDS(leaf, record.StateArchived))},
		},
		{
			name:  "where the rename unmounts, an archive container that still mounts waits while an operator looks inside one of its datasets",
			slots: 1,
			observed: []zfs.Dataset{parent, inherited(arch, "mountpoint", "/tank/nomad/.archive", "tank/nomad"), class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS(leaf, record.StateArchived), "canmount", "noauto")},
			renameUnmounts: true,
		},
		{
			name:  "where the rename unmounts, into an archive that mounts nothing: the rename is the unmount",
			slots: 2,
			observed: []zfs.Dataset{parent, archNone, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				following("tank/nomad/scratch/1", "canmount", "on", "mounted", "yes")},
			renameUnmounts: true,
			want: []act{
				{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""},
				{SetProp, "tank/nomad/scratch/1", "canmount", "noauto", ""},
				{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf},
			},
		},
		{
			name:  "where the rename unmounts, into an archive that still mounts: the archive gets mountpoint none, this release unmounts first",
			slots: 2,
			observed: []zfs.Dataset{parent, inherited(arch, "mountpoint", "/tank/nomad/.archive", "tank/nomad"), class, slotDS("tank/nomad/scratch/0", record.StateFree),
				following("tank/nomad/scratch/1", "canmount", "on", "mounted", "yes")},
			renameUnmounts: true,
			want:           append([]act{{SetProp, "tank/nomad/.archive", "mountpoint", "none", ""}}, unmountedFirst...),
		},
		{
			name:  "where the rename unmounts, a slot with a mountpoint of its own (a rename keeps it mounted): unmounted first",
			slots: 2,
			observed: []zfs.Dataset{parent, archNone, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "on")},
			renameUnmounts: true,
			want:           unmountedFirst,
		},
		{
			name:  "an archive that mounts nothing changes nothing where the rename does not unmount (zfs-fuse)",
			slots: 2,
			observed: []zfs.Dataset{parent, archNone, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				following("tank/nomad/scratch/1", "canmount", "on", "mounted", "yes")},
			want: unmountedFirst,
		},
		{
			name:  "surplus slot released: no new slot in its place",
			slots: 1,
			observed: []zfs.Dataset{parent, arch, class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateArchived), "canmount", "noauto", "mounted", "no", record.PropReleasedAt, "2026-11-21T14:30:00Z")},
			want: []act{{RenameToArchive, "tank/nomad/scratch/1", "", "", leaf}},
		},
		{
			name:  "someone else's .archive: no release step runs; the slot serves a fresh dataset beside the kept one",
			slots: 2,
			observed: []zfs.Dataset{parent, ds("tank/nomad/.archive"), class, slotDS("tank/nomad/scratch/0", record.StateFree),
				owned(slotDS("tank/nomad/scratch/1", record.StateReleasing))},
			want: []act{{CreateSlot, "tank/nomad/scratch/1.alt", "", "", ""}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.slots)
			cfg.RenameUnmounts = tc.renameUnmounts
			p := MakePlan(cfg, tc.observed, now)
			var got []act
			for _, a := range p.Actions {
				got = append(got, act{a.Kind, a.Dataset, a.Prop, a.Value, a.Target})
				if a.Kind == RenameToArchive || a.Kind == Unmount {
					must.Eq(t, a.Dataset, a.Chain)
				}
			}
			must.Eq(t, tc.want, got)
		})
	}
}

// Free datasets made to another configuration (source, encryption) are
// made again; a destroyed dataset's key goes with it only when no other
// dataset of the read records the same key ID.
func TestMakePlan_StaleFreeAndKeys(t *testing.T) {
	parent := ds("tank/nomad")
	class := ds("tank/nomad/scratch", record.PropManaged, record.ManagedClass)
	arch := ds("tank/nomad/.archive", record.PropManaged, record.ManagedArchive)
	const id, other = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	withProps := func(d zfs.Dataset, kv ...string) zfs.Dataset {
		for i := 0; i+1 < len(kv); i += 2 {
			d.Props[kv[i]] = zfs.Prop{Value: kv[i+1], Source: "local"}
		}
		return d
	}
	cases := []struct {
		name    string
		class   Class
		free    zfs.Dataset
		extra   []zfs.Dataset
		recycle bool
		keyID   string
		check   string
	}{
		{name: "as configured", class: Class{}, free: slotDS("tank/nomad/scratch/0", record.StateFree)},
		{name: "clone, source moved", class: Class{Source: "tank/g@v2"},
			free:    inherited(slotDS("tank/nomad/scratch/0", record.StateFree), "origin", "tank/g@v1", "-"),
			recycle: true, check: "tank/g@v2"},
		{name: "clone, source removed", class: Class{},
			free:    inherited(slotDS("tank/nomad/scratch/0", record.StateFree), "origin", "tank/g@v1", "-"),
			recycle: true},
		{name: "plain, class now encrypted", class: Class{Encrypted: true}, free: slotDS("tank/nomad/scratch/0", record.StateFree), recycle: true},
		{name: "encrypted, class no longer", class: Class{},
			free:    withProps(slotDS("tank/nomad/scratch/0", record.StateFree), record.PropKeyID, id),
			recycle: true, keyID: id},
		{name: "encrypted, its key ID also on another dataset", class: Class{},
			free:    withProps(slotDS("tank/nomad/scratch/0", record.StateFree), record.PropKeyID, id),
			extra:   []zfs.Dataset{withProps(ds("tank/nomad/.archive/x"), record.PropKeyID, id)},
			recycle: true, keyID: ""},
		{name: "encrypted as configured", class: Class{Encrypted: true},
			free:  withProps(slotDS("tank/nomad/scratch/0", record.StateFree), record.PropKeyID, other),
			extra: []zfs.Dataset{withProps(ds("tank/nomad/.archive/x"), record.PropKeyID, id)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(1)
			cfg.Classes[0].Source, cfg.Classes[0].Encrypted = tc.class.Source, tc.class.Encrypted
			obs := append([]zfs.Dataset{parent, class, arch, tc.free}, tc.extra...)
			p := MakePlan(cfg, obs, time.Now())
			var destroy *Action
			for i, a := range p.Actions {
				if a.Kind == DestroySlot && a.Dataset == tc.free.Name {
					destroy = &p.Actions[i]
				}
			}
			if !tc.recycle {
				must.Nil(t, destroy, must.Sprintf("%+v", p.Actions))
				return
			}
			must.NotNil(t, destroy, must.Sprintf("%+v", p.Actions))
			must.Eq(t, tc.keyID, destroy.KeyID)
			must.Eq(t, tc.check, destroy.CheckSource)
			must.NotEq(t, "", destroy.Why)
			must.Eq(t, []step{{DestroySlot, tc.free.Name}, {CreateSlot, tc.free.Name}}, steps(p)[len(steps(p))-2:])
		})
	}
}

// The archive container is made with mountpoint none where a rename
// unmounts, and without a mountpoint of its own elsewhere; a plan says
// whether the one it read mounts nothing.
func TestMakePlan_ArchiveMountpoint(t *testing.T) {
	parent := ds("tank/nomad")
	for _, tc := range []struct {
		name           string
		renameUnmounts bool
		archive        []zfs.Dataset
		wantProps      map[string]string // of CreateArchive; nil: none made
		wantUnmounted  bool
	}{
		{name: "made where the rename unmounts", renameUnmounts: true,
			wantProps: map[string]string{record.PropManaged: record.ManagedArchive, "canmount": "off", "mountpoint": "none"}},
		{name: "made where it does not",
			wantProps: map[string]string{record.PropManaged: record.ManagedArchive, "canmount": "off"}},
		{name: "read with mountpoint none", archive: []zfs.Dataset{ds("tank/nomad/.archive", record.PropManaged, record.ManagedArchive, "mountpoint", "none")},
			wantUnmounted: true},
		{name: "mountpoint none on someone else's dataset counts for nothing", archive: []zfs.Dataset{ds("tank/nomad/.archive", "mountpoint", "none")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(1)
			cfg.RenameUnmounts = tc.renameUnmounts
			p := MakePlan(cfg, append([]zfs.Dataset{parent}, tc.archive...), time.Now())
			var got map[string]string
			for _, a := range p.Actions {
				if a.Kind == CreateArchive {
					got = a.Props
				}
			}
			must.Eq(t, tc.wantProps, got)
			must.Eq(t, tc.wantUnmounted, p.ArchiveUnmounted)
		})
	}
}
