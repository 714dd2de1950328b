package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/zfstest"
)

// recordedOwner decodes the owner the plugin recorded on a dataset (the
// zero Owner when none is).
func recordedOwner(t *testing.T, pool *zfstest.Pool, ds string) record.Owner {
	t.Helper()
	o, err := record.DecodeOwner(pool.Prop(t, ds, record.PropOwner))
	must.NoError(t, err)
	return o
}

// archivedFor returns the archived dataset of an allocation, or "".
func archivedFor(t *testing.T, pool *zfstest.Pool, archive, allocID string) string {
	t.Helper()
	out := pool.ZFS(t, "get", "-H", "-r", "-d", "1", "-o", "name,value", record.PropOwner, archive)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, value, ok := strings.Cut(line, "\t")
		if !ok || strings.Contains(name, "@") || name == archive {
			continue
		}
		if o, err := record.DecodeOwner(value); err == nil && o.AllocID == allocID {
			return name
		}
	}
	return ""
}

// pollProp reads a property for a poll: a dataset missing for a moment (a
// release renames it away before the fresh one is created) reads as
// "(error …)", which equals no value a test waits for, instead of failing
// the test.
func pollProp(pool *zfstest.Pool, ds, prop string) string {
	v, err := pool.TryProp(ds, prop)
	if err != nil {
		return "(error " + err.Error() + ")"
	}
	return v
}

// pollStates reads, in one zfs command, what the state recorded on every
// dataset under root (root and snapshots left out) means to a reader outside
// the plugin (slots.StateOf). For polls: the plugin may rename or destroy a
// dataset between two commands, so a listing and a read of each dataset
// after it may find one gone; an error is returned, not fatal.
func pollStates(pool *zfstest.Pool, root string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := pool.Runner.ZFSCmd(ctx, "get", "-H", "-p", "-r", "-o", "name,property,value",
		record.PropState+","+record.PropOwner, root)
	if err != nil {
		return nil, err
	}
	stored := map[string]string{}
	owner := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("zfs get under %s: %d columns, want 3: %q", root, len(f), line)
		}
		if f[0] == root || strings.Contains(f[0], "@") {
			continue
		}
		switch f[1] {
		case record.PropState:
			stored[f[0]] = f[2]
		case record.PropOwner:
			owner[f[0]] = f[2]
		}
	}
	states := make(map[string]string, len(stored))
	for ds, st := range stored {
		states[ds] = string(record.StateOf(st, owner[ds]))
	}
	return states, nil
}

// pollState is what the state recorded on ds means to a reader outside the
// plugin (slots.StateOf: a fresh dataset is recorded "armed:…", and one in
// use shows its owner). It polls: an error is part of the answer.
func pollState(pool *zfstest.Pool, ds string) string {
	st, err := pool.TryProp(ds, record.PropState)
	if err != nil {
		return "(error " + err.Error() + ")"
	}
	owner, _ := pool.TryProp(ds, record.PropOwner)
	return string(record.StateOf(st, owner))
}

// stateOf is pollState for a dataset that must be readable.
func stateOf(t *testing.T, pool *zfstest.Pool, ds string) string {
	t.Helper()
	return string(record.StateOf(pool.Prop(t, ds, record.PropState), pool.Prop(t, ds, record.PropOwner)))
}

// servingDataset returns the dataset slot i of class "scratch" under parent
// serves from (see internal/slots/pair.go): the one in use, else the fresh
// one, else the slot's first name. It polls: a dataset it cannot read
// counts as neither.
func servingDataset(pool *zfstest.Pool, parent string, i int) string {
	first := fmt.Sprintf("%s/scratch/%d", parent, i)
	fresh := ""
	for _, n := range []string{first, first + record.AltSuffix} {
		switch pollState(pool, n) {
		case string(record.StateReserved):
			return n
		case string(record.StateFree):
			if fresh == "" {
				fresh = n
			}
		}
	}
	if fresh != "" {
		return fresh
	}
	return first
}
