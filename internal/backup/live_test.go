package backup

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/zfs"
)

func TestParseInUse_SavedZFSFuseOutput(t *testing.T) {
	out, err := os.ReadFile("testdata/get-class-zfs-fuse-0.7.txt")
	must.NoError(t, err)
	// Captured before liveProps held the GUID and the data's lineage (none
	// there was restored): the props asked for then.
	captured := slices.DeleteFunc(slices.Clone(liveProps), func(p string) bool { return p == "guid" || p == record.PropDataFrom })
	ds, err := zfs.ParseGet(out, append(captured, "name"))
	must.NoError(t, err)
	got := ParseInUse("state", "capt/nomad/state", ds)
	must.SliceLen(t, 2, got)
	must.Eq(t, "capt/nomad/state/0", got[0].Name)
	must.Eq(t, 0, got[0].Slot)
	must.Eq(t, "1a2b3c4d-1111-4222-8333-444444444444", got[0].AllocID)
	must.EqOp(t, uint64(0), got[0].GUID, must.Sprint("not read: the send reads it before its snapshot"))
	must.Eq(t, retention.Identity{Namespace: "default", Job: "web", Group: "g", Task: "server", Index: 2, Class: "state"}, got[0].Identity)
	must.Eq(t, "capt/nomad/state/1", got[1].Name, must.Sprint("armed with its owner recorded: in use"))
	must.Eq(t, "etl", got[1].Identity.Job)
	must.True(t, got[1].Owner.Known())
	must.SliceEmpty(t, ParseInUse("state", "capt/nomad/other", ds), must.Sprint("another class's datasets are not this one's"))
}

func TestTakenSince(t *testing.T) {
	rel := time.Date(2026, 12, 5, 12, 0, 7, 0, time.UTC) // release times are to the second
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"p/.archive/x@" + SnapshotPrefix + "20261205T120007.250000000Z", true}, // the same second
		{"p/.archive/x@" + SnapshotPrefix + "20261205T120009.000000000Z", true},
		{"p/.archive/x@" + SnapshotPrefix + "20261205T120006.999999999Z", false}, // before: an earlier tenant's
		{"p/.archive/x@" + SnapshotPrefix + "garbage", false},
		{"p/.archive/x@operators-own", false},
	} {
		must.EqOp(t, tc.want, takenSince(tc.name, rel), must.Sprint(tc.name))
	}
}
