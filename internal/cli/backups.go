package cli

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/backup"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/retention"
)

const backupsVerifyHelp = `Usage: nomad-device-zfs backups verify [options]

  Re-reads every stream in backup_dir and checks it against its manifest
  (size and SHA-256), and checks that each identity's newest backup has
  its whole chain (a full stream and the incrementals after it). Files
  under backup_dir that are not the plugin's sound backups are listed.
  Exits 1 when any stream or chain is bad, or an identity's data forked
  (CHECK "FORKED with <allocation>": a restore refuses; see backups
  set-aside). Needs -config: backup_dir is in
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

// chainRow is an identity's newest backup and the chain that restores it
// (backup.Summarize): the time of its data (its release, or for a live
// backup its snapshot while the task ran), its stream's creation and size,
// the chain's length (a full stream and the increments after it) and
// bytes; OK false when the chain is broken (or, for backups verify, a
// stream of it is bad), Error then saying why.
type chainRow struct {
	Identity      retention.Identity `json:"identity"`
	ReleasedAt    time.Time          `json:"newest_released_at"`
	Live          bool               `json:"newest_live,omitempty"`
	NewestCreated time.Time          `json:"newest_created"`
	NewestBytes   int64              `json:"newest_bytes"`
	Streams       int                `json:"streams"`
	Bytes         int64              `json:"bytes"`
	OK            bool               `json:"ok"`
	Error         string             `json:"error,omitempty"`
	// ForkedWith is the other fork's allocation when the identity's data
	// forked at its newest backup: a restore refuses until one fork is
	// set aside (backups set-aside). SetAside counts the streams set aside.
	ForkedWith string `json:"forked_with,omitempty"`
	SetAside   int    `json:"set_aside_streams,omitempty"`
}

// chainRowOf is the row of an identity's summary.
func chainRowOf(s backup.IdentitySummary) chainRow {
	row := chainRow{Identity: s.Identity, ReleasedAt: s.NewestAt(), Live: s.NewestLive, NewestCreated: s.NewestCreated, NewestBytes: s.NewestBytes,
		Streams: len(s.Chain), Bytes: s.ChainBytes, OK: s.Complete(), ForkedWith: s.ForkedWith, SetAside: s.SetAside}
	if !s.Complete() {
		row.Error = s.ChainErr.Error()
	}
	return row
}

// verifyBackups reads and checks every backup in dir.
func verifyBackups(dir string) (backupsReport, error) {
	r := backupsReport{Dir: dir, Streams: []streamRow{}, Chains: []chainRow{}}
	ms, problems, err := backup.List(dir, nil)
	if err != nil {
		return r, err
	}
	r.Other = problems
	for _, p := range problems {
		if filepath.Base(p.Path) == backup.SetAsideFile {
			r.Bad++ // which backups are set aside cannot be known: a restore refuses
		}
	}
	bad := map[uint64]error{} // streams that fail Verify, by GUID
	for _, m := range ms {
		row := streamRow{Identity: m.Identity, Path: m.StreamPath(), Created: m.Created, Full: m.BaseGUID == 0, Size: m.Size, OK: true}
		if err := backup.Verify(m); err != nil {
			row.OK, row.Error = false, err.Error()
			r.Bad++
			bad[m.GUID] = err
		}
		r.Streams = append(r.Streams, row)
	}
	for _, s := range backup.Summarize(ms) {
		row := chainRowOf(s)
		if !row.OK || row.ForkedWith != "" {
			r.Bad++
		}
		for _, m := range s.Chain {
			if err, ok := bad[m.GUID]; ok && row.OK {
				// A chain is only as good as each of its streams.
				row.OK, row.Error = false, fmt.Sprintf("its stream %s: %v", m.StreamPath(), err)
			}
		}
		r.Chains = append(r.Chains, row)
	}
	return r, nil
}

// chainTable is the rows of a table of chains, as backups verify and
// status show them: per identity, how old its newest backup is at now
// (of a release, or live: taken while the task ran), and what restores
// it.
func chainTable(chains []chainRow, now time.Time) [][]string {
	rows := [][]string{{"IDENTITY", "NEWEST BACKUP", "TAKEN", "AGE", "NEWEST SIZE", "CHAIN", "CHAIN SIZE", "CHECK"}}
	for _, c := range chains {
		check, chain, size, of := "ok", plural(c.Streams, "stream"), bytesIEC(uint64(c.Bytes)), "at release"
		if c.Live {
			of = "while running"
		}
		switch {
		case !c.OK:
			check = "BROKEN"
		case c.ForkedWith != "":
			check = "FORKED with " + c.ForkedWith
		}
		if c.Streams == 0 {
			chain, size = "-", "-"
		}
		rows = append(rows, []string{oneLine(c.Identity.String()), c.ReleasedAt.UTC().Format(time.RFC3339), of, age(now.Sub(c.ReleasedAt)),
			bytesIEC(uint64(c.NewestBytes)), chain, size, check})
	}
	return rows
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
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
		if err := table(w, chainTable(r.Chains, time.Now())); err != nil {
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

// backupsStatus is what `status` shows of backup_dir: per identity of this
// node's classes that back up (restore on), the newest backup and the
// chain that restores it, from the manifests as backups verify reads them
// (no stream is read: backups verify checks their bytes).
type backupsStatus struct {
	Dir string `json:"backup_dir"`
	// Error says why backup_dir could not be read (not mounted, say);
	// nothing else is known then.
	Error      string     `json:"error,omitempty"`
	Identities []chainRow `json:"identities"`
	// Streams and Bytes count every stream of those identities, older
	// chains included.
	Streams int   `json:"streams"`
	Bytes   int64 `json:"bytes"`
	// Broken counts the identities whose newest backup has no whole chain.
	Broken int `json:"broken"`
	// Problems counts the files in backup_dir, of any class, that are not
	// sound backups: backups verify names them.
	Problems int `json:"problems,omitempty"`
}

// readBackupsStatus reads the manifests in dir of the identities of
// classes.
func readBackupsStatus(dir string, classes map[string]bool) backupsStatus {
	b := backupsStatus{Dir: dir, Identities: []chainRow{}}
	ms, problems, err := backup.List(dir, nil)
	if err != nil {
		b.Error = err.Error()
		return b
	}
	b.Problems = len(problems)
	var ours []backup.Manifest
	for _, m := range ms {
		if classes[m.Identity.Class] && !m.Identity.Unknown {
			ours = append(ours, m)
		}
	}
	for _, s := range backup.Summarize(ours) {
		row := chainRowOf(s)
		if !row.OK {
			b.Broken++
		}
		b.Streams += s.Streams
		b.Bytes += s.Bytes
		b.Identities = append(b.Identities, row)
	}
	return b
}

// backupsLine is status's line on backup_dir.
func backupsLine(b backupsStatus) string {
	if b.Error != "" {
		return "backups: cannot be read: " + oneLine(b.Error)
	}
	line := fmt.Sprintf("backup_dir %s: %s backed up, %s, %s", b.Dir, plural(len(b.Identities), "identity"), plural(b.Streams, "stream"), bytesIEC(uint64(b.Bytes)))
	if b.Broken > 0 {
		line += fmt.Sprintf("; BROKEN chains: %d (a restore of those fails)", b.Broken)
	}
	if b.Problems > 0 {
		line += fmt.Sprintf("; not sound backups: %s (backups verify names them)", plural(b.Problems, "file"))
	}
	return line
}
