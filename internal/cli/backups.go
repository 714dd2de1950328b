package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

const backupsVerifyHelp = `Usage: nomad-device-zfs backups verify [options]

  Re-reads every stream in backup_dir and checks it against its manifest
  (size and SHA-256), and checks that each identity's newest backup has
  its whole chain (a full stream and the incrementals after it). Files
  under backup_dir that are not the plugin's sound backups are listed.
  Exits 1 when any stream or chain is bad. Needs -config: backup_dir is in
  the agent's configuration. It changes nothing.
` + commonHelp

// errNoBackupDir: backups verify without a backup_dir to read.
var errNoBackupDir = errors.New("backups verify needs -config with a backup_dir: the plugin block sets none")

// backupsReport is what `backups verify` shows; -json prints it.
type backupsReport struct {
	Dir     string           `json:"backup_dir"`
	Streams []streamRow      `json:"streams"`
	Chains  []chainRow       `json:"chains"`
	Other   []backup.Problem `json:"problems,omitempty"`
	Bad     int              `json:"bad"`
}

type streamRow struct {
	Identity retention.Identity `json:"identity"`
	Path     string             `json:"path"`
	Created  time.Time          `json:"created"`
	Full     bool               `json:"full"`
	Size     int64              `json:"size"`
	OK       bool               `json:"ok"`
	Error    string             `json:"error,omitempty"`
}

// chainRow is an identity's newest backup and the chain that restores it:
// its release time, the chain's length (a full stream and the increments
// after it) and bytes.
type chainRow struct {
	Identity   retention.Identity `json:"identity"`
	ReleasedAt time.Time          `json:"newest_released_at"`
	Streams    int                `json:"streams"`
	Bytes      int64              `json:"bytes"`
	OK         bool               `json:"ok"`
	Error      string             `json:"error,omitempty"`
}

// verifyBackups reads and checks every backup in dir.
func verifyBackups(dir string) (backupsReport, error) {
	r := backupsReport{Dir: dir, Streams: []streamRow{}, Chains: []chainRow{}}
	ms, problems, err := backup.List(dir, nil)
	if err != nil {
		return r, err
	}
	r.Other = problems
	byID := map[retention.Identity][]backup.Manifest{}
	bad := map[uint64]error{} // streams that fail Verify, by GUID
	for _, m := range ms {
		row := streamRow{Identity: m.Identity, Path: m.StreamPath(), Created: m.Created, Full: m.BaseGUID == 0, Size: m.Size, OK: true}
		if err := backup.Verify(m); err != nil {
			row.OK, row.Error = false, err.Error()
			r.Bad++
			bad[m.GUID] = err
		}
		r.Streams = append(r.Streams, row)
		byID[m.Identity] = append(byID[m.Identity], m)
	}
	for id, list := range byID {
		row := chainRow{Identity: id, ReleasedAt: list[0].ReleasedAt, OK: true}
		chain, err := backup.Chain(list)
		if err != nil {
			row.OK, row.Error = false, err.Error()
			r.Bad++
		}
		row.Streams = len(chain)
		for _, m := range chain {
			row.Bytes += m.Size
			if err, ok := bad[m.GUID]; ok && row.OK {
				// A chain is only as good as each of its streams.
				row.OK, row.Error = false, fmt.Sprintf("its stream %s: %v", m.StreamPath(), err)
			}
		}
		r.Chains = append(r.Chains, row)
	}
	sort.Slice(r.Chains, func(i, j int) bool { return r.Chains[i].Identity.String() < r.Chains[j].Identity.String() })
	return r, nil
}

// renderBackups writes the report of `backups verify`.
func renderBackups(w io.Writer, r backupsReport) error {
	if _, err := fmt.Fprintf(w, "backup_dir %s: %s, %s\n\n", r.Dir, plural(len(r.Streams), "stream"), plural(len(r.Chains), "identity")); err != nil {
		return err
	}
	if len(r.Streams) > 0 {
		rows := [][]string{{"IDENTITY", "CREATED", "KIND", "SIZE", "CHECK", "STREAM"}}
		for _, s := range r.Streams {
			kind, check := "incremental", "ok"
			if s.Full {
				kind = "full"
			}
			if !s.OK {
				check = "BAD"
			}
			rows = append(rows, []string{oneLine(s.Identity.String()), s.Created.UTC().Format(time.RFC3339), kind, bytesIEC(uint64(s.Size)), check, s.Path})
		}
		if err := table(w, rows); err != nil {
			return err
		}
	}
	if len(r.Chains) > 0 {
		// Per identity: how old its newest backup is, and what restores it.
		rows := [][]string{{"IDENTITY", "NEWEST RELEASE", "AGE", "CHAIN", "SIZE", "CHECK"}}
		for _, c := range r.Chains {
			check := "ok"
			if !c.OK {
				check = "BROKEN"
			}
			rows = append(rows, []string{oneLine(c.Identity.String()), c.ReleasedAt.UTC().Format(time.RFC3339), age(time.Since(c.ReleasedAt)),
				plural(c.Streams, "stream"), bytesIEC(uint64(c.Bytes)), check})
		}
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
		if err := table(w, rows); err != nil {
			return err
		}
	}
	for _, s := range r.Streams {
		if !s.OK {
			if _, err := fmt.Fprintf(w, "\nBAD %s: %s", s.Path, oneLine(s.Error)); err != nil {
				return err
			}
		}
	}
	for _, c := range r.Chains {
		if !c.OK {
			if _, err := fmt.Fprintf(w, "\nBAD chain of %s: %s", oneLine(c.Identity.String()), oneLine(c.Error)); err != nil {
				return err
			}
		}
	}
	for _, p := range r.Other {
		if _, err := fmt.Fprintf(w, "\nnot a backup: %s: %s", p.Path, oneLine(p.Reason)); err != nil {
			return err
		}
	}
	verdict := "\n\nAll streams match their manifests, and every identity's newest backup has its whole chain.\n"
	if r.Bad > 0 {
		verdict = fmt.Sprintf("\n\n%d bad: a restore of those identities fails (restore = \"required\") or starts empty (\"best-effort\").\n", r.Bad)
	}
	_, err := fmt.Fprint(w, verdict)
	return err
}
