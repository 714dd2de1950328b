// Package backup keeps archived datasets in a directory every client can
// reach (backup_dir): `zfs send` streams, each with a manifest that names
// the identity it belongs to, the snapshot it holds (and the one it is
// incremental from) by GUID, its size and its SHA-256. Files are written
// atomically (temporary name, fsync, rename, fsync of the directory), so a
// reader sees a stream whole or not at all; a stream is received only once
// its size and checksum match its manifest. Only files under
// <backup_dir>/nomad-device-zfs/ that carry the plugin's manifest are ever
// read, replaced or removed.
package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/record"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

// Root is the directory under backup_dir that holds everything the plugin
// writes there.
const Root = "nomad-device-zfs"

// Kind marks a manifest as the plugin's.
const Kind = "nomad-device-zfs-backup"

// Manifest describes one stream in backup_dir.
type Manifest struct {
	Kind    string `json:"kind"`
	Version int    `json:"version"`
	// Identity is the data's identity (see retention.Identity); AllocID
	// the allocation that left it, Node the node that sent it.
	Identity retention.Identity `json:"identity"`
	AllocID  string             `json:"alloc_id"`
	Node     string             `json:"node,omitempty"`
	// Dataset is the archive the stream was sent from, Snapshot the name
	// (after @) of the snapshot it holds, GUID that snapshot's GUID.
	Dataset string `json:"dataset"`
	// Slot is the index of the slot the archive was released from.
	Slot     int    `json:"slot"`
	Snapshot string `json:"snapshot"`
	GUID     uint64 `json:"guid"`
	// BaseGUID is the GUID of the snapshot an incremental stream is based
	// on (the identity's previous backup); 0 for a full stream.
	BaseGUID uint64 `json:"base_guid,omitempty"`
	// ReleasedAt is when the archive's release began; for a live backup,
	// when its snapshot was taken.
	ReleasedAt time.Time `json:"released_at"`
	// Live marks a live backup: a snapshot of a dataset in use, taken
	// while its task ran (backup_interval), not of its release; the
	// allocation may have written more after it.
	Live    bool      `json:"live,omitempty"`
	Created time.Time `json:"created"`
	// Stream is the stream's file name, beside the manifest; Size and
	// SHA256 are the file's.
	Stream string `json:"stream"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// KeyID is the key of an encrypted archive (a raw stream): its key
	// file is KeyFile beside the manifest. "" for a plain one.
	KeyID string `json:"key_id,omitempty"`
	// From is the lineage of its data (record.PropDataFrom on the dataset
	// sent): the allocations it was restored from, newest first. It
	// orders nothing by itself; it shows where the data forked (forkAt).
	From record.Lineage `json:"data_from,omitempty"`
	// SetAside says that the operator set its allocation's backups aside
	// (SetAsideFile, beside it): a restore never takes its data. Not
	// stored in the manifest; List reads it.
	SetAside bool `json:"-"`

	// path is where the manifest was read from (List); not stored.
	path string
}

// Path is the file the manifest was read from ("" for one not read).
func (m Manifest) Path() string { return m.path }

// StreamPath is the stream's file.
func (m Manifest) StreamPath() string { return filepath.Join(filepath.Dir(m.path), m.Stream) }

// IdentityDir returns the directory of an identity's streams under dir:
// <dir>/nomad-device-zfs/<32 hex digits of the identity's SHA-256>, the
// same on every node.
func IdentityDir(dir string, id retention.Identity) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{id.Namespace, id.Job, id.Group, id.Task, fmt.Sprint(id.Index), id.Class}, "\x00")))
	return filepath.Join(dir, Root, hex.EncodeToString(sum[:16]))
}

// Problem is a file in backup_dir that is not a sound backup, with why.
type Problem struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// List reads every manifest under <dir>/nomad-device-zfs (when only is
// not nil: in the directory of that identity alone), newest first, each
// marked SetAside as its directory's SetAsideFile says. A manifest (or a
// SetAsideFile) that does not parse, or is not the plugin's, is a Problem; the
// streams themselves are not read (Verify does that). Any error reading a
// directory is an error, save an identity directory that does not exist
// (no backup of it); so is a missing <dir>/nomad-device-zfs, which the
// plugin makes when it starts (see EnsureRoot): a share that is not
// mounted never reads as "no backups".
func List(dir string, only *retention.Identity) ([]Manifest, []Problem, error) {
	root := filepath.Join(dir, Root)
	if _, err := os.Stat(root); err != nil {
		return nil, nil, fmt.Errorf("backup_dir %s: %w (is it mounted? the plugin makes %s/ when it starts)", dir, err, Root)
	}
	var dirs []string
	if only != nil {
		dirs = []string{IdentityDir(dir, *only)}
	} else {
		entries, err := os.ReadDir(root)
		if err != nil {
			return nil, nil, fmt.Errorf("backup_dir: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(root, e.Name()))
			}
		}
	}
	var out []Manifest
	var problems []Problem
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) && only != nil {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("backup_dir: %w", err)
		}
		set, err := readSetAside(d)
		if err != nil {
			problems = append(problems, Problem{Path: filepath.Join(d, SetAsideFile), Reason: err.Error()})
		}
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
				continue
			}
			f := filepath.Join(d, e.Name())
			m, err := readManifest(f)
			if err != nil {
				problems = append(problems, Problem{Path: f, Reason: err.Error()})
				continue
			}
			m.SetAside = set[m.AllocID]
			out = append(out, m)
		}
	}
	sortNewestFirst(out)
	return out, problems, nil
}

// sortNewestFirst orders manifests newest first: by when each was written.
func sortNewestFirst(out []Manifest) {
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.After(out[j].Created)
		}
		return out[i].path < out[j].path
	})
}

// EnsureRoot makes <dir>/nomad-device-zfs when dir exists, so that List can
// tell a backup_dir that holds no backup yet from one that is not there.
func EnsureRoot(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("backup_dir %s: %w", dir, err)
	}
	return os.MkdirAll(filepath.Join(dir, Root), 0o700)
}

func readManifest(path string) (Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Manifest{}, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("manifest does not parse: %w", err)
	}
	switch {
	case m.Kind != Kind:
		return Manifest{}, fmt.Errorf("not a nomad-device-zfs manifest (kind %q)", m.Kind)
	case m.Version != 1:
		return Manifest{}, fmt.Errorf("manifest version %d: this build reads version 1", m.Version)
	case m.Stream == "" || strings.ContainsAny(m.Stream, "/\\") || m.GUID == 0 || len(m.SHA256) != 64:
		return Manifest{}, errors.New("manifest lacks its stream, GUID or checksum")
	}
	m.path = path
	return m, nil
}

// Chain returns the streams that rebuild the newest snapshot among ms (all
// of one identity, as List returns them): a full stream and the
// incrementals after it, in the order to receive them. It fails when the
// newest snapshot's chain is broken (a base missing).
func Chain(ms []Manifest) ([]Manifest, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	return chainOf(ms, ms[0])
}

// chainOf returns the chain of streams among ms that rebuilds the snapshot
// of last: a full stream and the incrementals after it, last at the end.
func chainOf(ms []Manifest, last Manifest) ([]Manifest, error) {
	return chainIn(byGUID(ms), last)
}

// byGUID indexes ms by snapshot GUID, the first of each GUID kept (the
// newest, as List orders them).
func byGUID(ms []Manifest) map[uint64]Manifest {
	index := make(map[uint64]Manifest, len(ms))
	for _, m := range ms {
		if _, dup := index[m.GUID]; !dup {
			index[m.GUID] = m
		}
	}
	return index
}

// chainIn is chainOf over an index made by byGUID.
func chainIn(index map[uint64]Manifest, last Manifest) ([]Manifest, error) {
	chain := []Manifest{last}
	for cur := last; cur.BaseGUID != 0; {
		base, ok := index[cur.BaseGUID]
		if !ok {
			return nil, fmt.Errorf("the chain of %s is broken: its base (snapshot GUID %d) is not in backup_dir", cur.Path(), cur.BaseGUID)
		}
		if len(chain) > len(index) {
			return nil, fmt.Errorf("the chain of %s loops", last.Path())
		}
		chain = append(chain, base)
		cur = base
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain, nil
}
