package keys

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/slots/reconcile"
)

// TestRemove: a destroyed dataset's key goes from key_dir; a dataset with
// no key, or no key_dir, removes nothing; a key not in key_dir is no error
// (it was moved by hand: the warning says where to look). The creation
// of an encrypted dataset (Create) is tested on a real pool by the slots
// package (encryption_test.go).
func TestRemove(t *testing.T) {
	cases := []struct {
		name     string
		keyDir   bool // a key_dir is configured
		hasKey   bool // the action names a key
		onDisk   bool // the key is in key_dir
		keptFile bool // a key file is left in key_dir afterwards
	}{
		{name: "key removed", keyDir: true, hasKey: true, onDisk: true},
		{name: "key not in key_dir: no error", keyDir: true, hasKey: true},
		{name: "no key named: another key stays", keyDir: true, onDisk: true, keptFile: true},
		{name: "no key_dir: nothing removed", hasKey: true, onDisk: true, keptFile: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			id := "0123456789abcdef0123456789abcdef"
			if tc.onDisk {
				var err error
				id, err = record.NewKey(dir)
				must.NoError(t, err)
			}
			a := reconcile.Action{Dataset: "pool/slots/scratch/0"}
			if tc.hasKey {
				a.KeyID = id
			}
			keyDir := ""
			if tc.keyDir {
				keyDir = dir
			}
			must.NoError(t, Remove(hclog.NewNullLogger(), keyDir, a))
			_, err := os.Stat(record.KeyPath(dir, id))
			if tc.keptFile {
				must.NoError(t, err)
			} else {
				must.True(t, errors.Is(err, fs.ErrNotExist), must.Sprintf("stat: %v", err))
			}
		})
	}
}
