package shared

import (
	"errors"
	"fmt"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/hostfs"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestJudge(t *testing.T) {
	c := Class{Name: "models", Dataset: "tank/models", Slots: 3, MountPath: "/models", ReadOnly: true}
	ds := func(kv ...string) zfs.Dataset {
		d := zfs.Dataset{Name: "tank/models", Props: map[string]zfs.Prop{}}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Props[kv[i]] = zfs.Prop{Value: kv[i+1], Source: "default"}
		}
		return d
	}
	good := []string{"type", "filesystem", "mounted", "yes", "mountpoint", "/tank/models", "used", "1024",
		"available", "4096", "referenced", "512", "compressratio", "1.50x", "guid", "42"}
	with := func(k, v string) []string {
		out := append([]string(nil), good...)
		for i := 0; i < len(out); i += 2 {
			if out[i] == k {
				out[i+1] = v
			}
		}
		return out
	}
	mounted := hostfs.Table{{ID: 1, MountPoint: "/", Root: "/"}, {ID: 2, ParentID: 1, MountPoint: "/tank/models", Root: "/", Source: "tank/models", FSType: "zfs",
		Options: []string{"ro", "nosuid", "nodev"}}}
	with2 := func(ms ...hostfs.Mount) hostfs.Table { return append(append(hostfs.Table(nil), mounted...), ms...) }
	covered := with2(hostfs.Mount{ID: 3, ParentID: 2, MountPoint: "/tank/models", Root: "/", Source: "tmpfs", FSType: "tmpfs"})
	fuse := hostfs.Table{{ID: 1, MountPoint: "/", Root: "/"}, {ID: 2, ParentID: 1, MountPoint: "/tank/models", Root: "/", Source: "tank/models", FSType: "fuse",
		SuperOptions: []string{"rw", "user_id=0", "group_id=0"}}}
	userFuse := hostfs.Table{{ID: 1, MountPoint: "/", Root: "/"}, {ID: 2, ParentID: 1, MountPoint: "/tank/models", Root: "/", Source: "tank/models", FSType: "fuse.sshfs",
		SuperOptions: []string{"rw", "user_id=1000", "group_id=1000"}}}
	subdir := hostfs.Table{{ID: 1, MountPoint: "/", Root: "/"}, {ID: 2, ParentID: 1, MountPoint: "/tank/models", Root: "/other", Source: "tank/models", FSType: "zfs"}}
	noFlags := hostfs.Table{{ID: 1, MountPoint: "/", Root: "/"}, {ID: 2, ParentID: 1, MountPoint: "/tank/models", Root: "/", Source: "tank/models", FSType: "zfs", Options: []string{"rw"}}}
	writable := c
	writable.ReadOnly = false

	cases := []struct {
		name     string
		c        *Class // nil: c
		private  []string
		real     string // the private path's symlinks resolved; "": as it is
		d        zfs.Dataset
		readErr  error
		parentMP string
		table    hostfs.Table
		tableErr error
		wantWhy  string // "" for healthy
	}{
		{name: "healthy", d: ds(good...), parentMP: "/tank/nomad", table: mounted},
		{name: "missing", readErr: fmt.Errorf("zfs get: %w", zfs.ErrNotExist), table: mounted, wantWhy: "does not exist"},
		{name: "unreadable", readErr: errors.New("timed out"), table: mounted, wantWhy: "cannot be read: timed out"},
		{name: "malformed", d: zfs.Dataset{Name: "tank/models", Err: errors.New("value with a newline")}, table: mounted, wantWhy: "do not parse"},
		{name: "a volume", d: ds(with("type", "volume")...), table: mounted, wantWhy: "is a volume, not a filesystem"},
		{name: "not mounted", d: ds(with("mounted", "no")...), table: mounted, wantWhy: "is not mounted (mounted=no"},
		{name: "legacy mountpoint", d: ds(with("mountpoint", "legacy")...), table: mounted, wantWhy: `mountpoint "legacy" is not a path`},
		{name: "mounted at /", d: ds(with("mountpoint", "/")...), table: mounted, wantWhy: `mountpoint "/" is not a path`},
		{name: "holds the parent's mountpoint", d: ds(good...), parentMP: "/tank/models/nomad", table: mounted, wantWhy: "holds the plugin's parent dataset"},
		{name: "nothing at the mountpoint", d: ds(good...), table: mounted[:1], wantWhy: "nothing is mounted at its mountpoint /tank/models"},
		{name: "something else on top", d: ds(good...), table: covered, wantWhy: "the mount at /tank/models is tmpfs (tmpfs, root /), not this dataset"},
		{name: "zfs-fuse (FUSE run by root)", d: ds(good...), table: fuse},
		{name: "a user's FUSE mount named like it", d: ds(good...), table: userFuse, wantWhy: "is tank/models (fuse.sshfs, root /), not this dataset"},
		{name: "a bind of a directory", d: ds(good...), table: subdir, wantWhy: "root /other), not this dataset"},
		{name: "its own child mounted inside", d: ds(good...), table: with2(hostfs.Mount{ID: 4, ParentID: 2, MountPoint: "/tank/models/llama", Root: "/", Source: "tank/models/llama", FSType: "zfs"})},
		{name: "a slot mounted inside", d: ds(good...), table: with2(hostfs.Mount{ID: 4, ParentID: 2, MountPoint: "/tank/models/x", Root: "/", Source: "tank/nomad/ci/0", FSType: "zfs"}),
			wantWhy: "tank/nomad/ci/0 (zfs) is mounted inside it at /tank/models/x"},
		{name: "holds key_dir", private: []string{"/tank/models/keys"}, d: ds(good...), table: mounted, wantWhy: "holds /tank/models/keys, the plugin's own"},
		{name: "key_dir through a symlink", private: []string{"/var/lib/keys"}, real: "/tank/models/keys", d: ds(good...), table: mounted, wantWhy: "holds /var/lib/keys (/tank/models/keys), the plugin's own"},
		{name: "private elsewhere", private: []string{"/var/lib/keys", "/tank/modelsx"}, d: ds(good...), table: mounted},
		{name: "writable with nosuid,nodev", c: &writable, d: ds(good...), table: mounted},
		{name: "writable without nosuid,nodev", c: &writable, d: ds(good...), table: noFlags, wantWhy: "writes are allowed and its mount at /tank/models lacks nosuid or nodev"},
		{name: "read-only without nosuid,nodev", d: ds(good...), table: noFlags},
		{name: "no mount table", d: ds(good...), tableErr: errors.New("no /proc"), wantWhy: "the mount table cannot be read"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := c
			if tc.c != nil {
				cl = *tc.c
			}
			var private []privatePath
			for _, p := range tc.private {
				real := p
				if tc.real != "" {
					real = tc.real
				}
				private = append(private, privatePath{path: p, real: real})
			}
			st := judge(cl, tc.d, tc.readErr, tc.parentMP, private, tc.table, tc.tableErr)
			must.Eq(t, cl, st.Class)
			if tc.wantWhy == "" {
				must.True(t, st.Healthy)
				must.Eq(t, "", st.Why)
				must.Eq(t, "/tank/models", st.Mountpoint)
				must.Eq(t, "42", st.GUID)
				must.Eq(t, zfs.Usage{Used: 1024, Available: 4096, Referenced: 512, CompressRatio: 1.5}, st.Usage)
				return
			}
			must.False(t, st.Healthy)
			must.StrContains(t, st.Why, "shared dataset tank/models: ")
			must.StrContains(t, st.Why, tc.wantWhy)
		})
	}
}

func TestClassOfID(t *testing.T) {
	s := NewSet(nil)
	s.SetConfig("tank/nomad", nil, []Class{{Name: "models", Dataset: "tank/models", Slots: 2}, {Name: "models-x", Dataset: "tank/x", Slots: 1}})
	for _, tc := range []struct {
		id, want string
	}{{"models-0", "models"}, {"models-1", "models"}, {"models-2", ""}, {"models-01", ""}, {"models--1", ""},
		{"models-x-0", "models-x"}, {"models-x", ""}, {"scratch-0", ""}} {
		c, ok := s.Class(tc.id)
		must.Eq(t, tc.want != "", ok, must.Sprint(tc.id))
		must.Eq(t, tc.want, c.Name, must.Sprint(tc.id))
	}
}
