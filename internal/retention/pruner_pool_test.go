package retention_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestMain(m *testing.M) { zfstest.Main(m) }

// archiveFixture is a real pool with the plugin's parent and archive
// container, and a way to put archives in it as a release leaves them.
type archiveFixture struct {
	pool   *zfstest.Pool
	cfg    slots.Config
	client *zfs.Client
	now    time.Time
}

func newArchiveFixture(t *testing.T) *archiveFixture {
	t.Helper()
	pool := zfstest.NewPool(t, 512<<20)
	f := &archiveFixture{pool: pool, cfg: slots.Config{Parent: pool.Dataset("nomad")},
		client: zfs.NewClient(pool.Runner), now: time.Now().UTC().Truncate(time.Second)}
	pool.ZFS(t, "create", f.cfg.Parent)
	pool.ZFS(t, "create", "-o", record.PropManaged+"="+record.ManagedArchive, "-o", "canmount=noauto", f.cfg.ArchiveDataset())
	return f
}

// add makes an archive of owner o (zero for unknown) released ago, holding
// mib MiB of random data, marked as a release marks it; it returns its name.
func (f *archiveFixture) add(t *testing.T, class string, slot int, o record.Owner, ago time.Duration, mib int) string {
	t.Helper()
	name := record.ArchivedName(f.cfg.ArchiveDataset(), class, slot, o, f.now.Add(-ago))
	f.pool.ZFS(t, "create", name)
	if mib > 0 {
		mnt := strings.TrimSpace(f.pool.ZFS(t, "get", "-H", "-o", "value", "mountpoint", name))
		buf := make([]byte, mib<<20)
		_, err := rand.Read(buf)
		must.NoError(t, err)
		must.NoError(t, os.WriteFile(filepath.Join(mnt, "data"), buf, 0o600))
	}
	f.pool.ZFS(t, "unmount", name)
	f.pool.ZFS(t, "set", "canmount=noauto", name)
	f.pool.ZFS(t, "set", record.PropManaged+"="+record.ManagedSlot, name)
	f.pool.ZFS(t, "set", record.PropState+"="+string(record.StateArchived), name)
	if o.Known() {
		f.pool.ZFS(t, "set", record.PropOwner+"="+o.Encode(), name)
	}
	return name
}

// names lists the datasets directly under the archive container.
func (f *archiveFixture) names(t *testing.T) []string {
	t.Helper()
	out := f.pool.ZFS(t, "list", "-H", "-o", "name", "-r", "-d", "1", f.cfg.ArchiveDataset())
	var names []string
	for _, n := range strings.Fields(out) {
		if n != f.cfg.ArchiveDataset() {
			names = append(names, n)
		}
	}
	return names
}

func (f *archiveFixture) pruner(rules retention.Rules) *retention.Pruner {
	p := retention.New(f.client, hclog.NewNullLogger())
	p.SetConfig(retention.Config{Container: f.cfg.ArchiveDataset(), Rules: rules})
	return p
}

func owner(job string, index int) record.Owner {
	return record.Owner{AllocID: "0000000" + string(rune('a'+index)) + "-1111-4222-8333-" + strings.Repeat("4", 12),
		Namespace: "default", Job: job, Group: "g", Task: "t", AllocName: job + ".g[" + string(rune('0'+index)) + "]"}
}

// again is o's identity in another allocation (the n-th replacement).
func again(o record.Owner, n int) record.Owner {
	o.AllocID = fmt.Sprintf("%08x%s", n, o.AllocID[8:])
	return o
}

func TestPruner_KeepMaxAgeAndWhatItLeavesAlone(t *testing.T) {
	f := newArchiveFixture(t)
	ctx := context.Background()
	web := owner("web", 0)
	web1 := owner("web", 1)
	db := owner("db", 0)
	newest := f.add(t, "state", 0, again(web, 1), 1*time.Hour, 0)
	second := f.add(t, "state", 1, again(web, 2), 2*time.Hour, 0)
	oldest := f.add(t, "state", 0, again(web, 3), 3*time.Hour, 0)
	otherIndex := f.add(t, "state", 2, web1, 4*time.Hour, 0)
	tooOld := f.add(t, "state", 0, db, 48*time.Hour, 0)
	unknown := f.add(t, "state", 3, record.Owner{}, 5*time.Hour, 0)
	// A snapshot under a pruned archive goes with it (destroy -r, inside
	// the container only).
	f.pool.ZFS(t, "snapshot", oldest+"@keep-me-not")
	// What retention must never touch: the operator's dataset, a release
	// in progress, a name the plugin did not make, and what lies outside
	// the container.
	notes := f.cfg.ArchiveDataset() + "/operator-notes"
	f.pool.ZFS(t, "create", notes)
	destroying := f.add(t, "state", 4, again(web, 4), 100*time.Hour, 0)
	f.pool.ZFS(t, "set", record.PropState+"="+string(record.StateDestroying), destroying)
	byHand := f.cfg.ArchiveDataset() + "/renamed-by-hand"
	f.pool.ZFS(t, "create", "-o", record.PropManaged+"="+record.ManagedSlot, "-o", record.PropState+"=archived", byHand)
	outside := f.pool.Dataset("nomad/state-0.default.web.g.t.00000000.20200101T000000Z")
	f.pool.ZFS(t, "create", "-o", record.PropManaged+"="+record.ManagedSlot, "-o", record.PropState+"=archived", outside)

	p := f.pruner(retention.Rules{Classes: map[string]retention.Policy{"state": {Keep: 2, MaxAge: 24 * time.Hour}}})
	res, err := p.Pass(ctx)
	must.NoError(t, err)
	must.False(t, res.More)
	must.Eq(t, []string{tooOld, oldest}, res.Destroyed)
	must.SliceContainsAll(t, []string{newest, second, otherIndex, unknown, notes, destroying, byHand}, f.names(t))
	must.SliceLen(t, 7, f.names(t))
	must.Eq(t, "archived", f.pool.Prop(t, outside, record.PropState))

	// A second pass finds nothing more to do.
	res, err = p.Pass(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, res.Planned)
}

func TestPruner_BatchesALongBacklog(t *testing.T) {
	f := newArchiveFixture(t)
	web := owner("web", 0)
	n := retention.BatchSize + 3
	for i := 0; i < n; i++ {
		f.add(t, "state", 0, again(web, i+1), time.Duration(i+1)*time.Minute, 0)
	}
	p := f.pruner(retention.Rules{Classes: map[string]retention.Policy{"state": {Keep: 1}}})
	res, err := p.Pass(context.Background())
	must.NoError(t, err)
	must.True(t, res.More)
	must.SliceLen(t, retention.BatchSize, res.Destroyed)
	res, err = p.Pass(context.Background())
	must.NoError(t, err)
	must.False(t, res.More)
	must.SliceLen(t, n-1-retention.BatchSize, res.Destroyed)
	must.SliceLen(t, 1, f.names(t))
}

func TestPruner_ArchiveQuota(t *testing.T) {
	f := newArchiveFixture(t)
	ctx := context.Background()
	a := f.add(t, "state", 0, owner("a", 0), 3*time.Hour, 20)
	b := f.add(t, "state", 1, owner("b", 0), 2*time.Hour, 12)
	c := f.add(t, "state", 2, owner("c", 0), 1*time.Hour, 1)
	container := f.cfg.ArchiveDataset()

	rules := retention.Rules{Classes: map[string]retention.Policy{"state": {Keep: 3}}, Quota: 40 << 20, Headroom: 10 << 20}
	p := f.pruner(rules)
	res, err := p.Pass(ctx)
	must.NoError(t, err)
	must.Eq(t, []string{a}, res.Destroyed)
	must.Eq(t, []string{b, c}, f.names(t))
	must.Eq(t, "41943040", f.pool.Prop(t, container, "quota"))
	must.Eq(t, "41943040", f.pool.Prop(t, container, retention.PropArchiveQuota))

	// The quota holds in ZFS: an archive that does not fit cannot be
	// renamed in (the release then fails and is retried; the data stays
	// in its slot).
	big := f.pool.Dataset("nomad/big")
	f.pool.ZFS(t, "create", big)
	mnt := strings.TrimSpace(f.pool.ZFS(t, "get", "-H", "-o", "value", "mountpoint", big))
	buf := make([]byte, 30<<20)
	_, err = rand.Read(buf)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(filepath.Join(mnt, "data"), buf, 0o600))
	f.pool.ZFS(t, "unmount", big)
	_, err = f.pool.Runner.ZFSCmd(ctx, "rename", big, container+"/big")
	must.Error(t, err)

	// Without archive_quota, the quota the plugin set goes; one the
	// operator set stays.
	p.SetConfig(retention.Config{Container: container, Rules: retention.Rules{Classes: rules.Classes}})
	_, err = p.Pass(ctx)
	must.NoError(t, err)
	must.Eq(t, "0", f.pool.Prop(t, container, "quota"))
	f.pool.ZFS(t, "set", "quota=200M", container)
	_, err = p.Pass(ctx)
	must.NoError(t, err)
	must.Eq(t, "209715200", f.pool.Prop(t, container, "quota"))
}
