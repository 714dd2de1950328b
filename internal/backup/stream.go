package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/durable"
)

// ErrCorrupt: a stream's size or checksum does not match its manifest.
var ErrCorrupt = errors.New("backup stream does not match its manifest")

// Sender is what Write needs from ZFS. *zfs.Client implements it.
type Sender interface {
	Send(ctx context.Context, snapshot, base string, w io.Writer) error
	SendRaw(ctx context.Context, snapshot, base string, w io.Writer) error
}

// Receiver is what Receive needs from ZFS. *zfs.Client implements it.
type Receiver interface {
	Receive(ctx context.Context, target string, r io.Reader) error
}

// Write sends snapshot (dataset@name; incremental from base, a snapshot of
// the same dataset, when base is not "") into the identity's directory
// under dir, then writes m (filled in with the stream's name, size and
// checksum) beside it. Both are written to temporary names, fsynced and
// renamed, then the directory is fsynced: on return the backup is whole on
// disk, or absent (nothing is left behind on an error).
func Write(ctx context.Context, z Sender, dir, snapshot, base string, m Manifest) (Manifest, error) {
	idDir := IdentityDir(dir, m.Identity)
	if err := os.MkdirAll(idDir, 0o700); err != nil {
		return m, fmt.Errorf("backup_dir: %w", err)
	}
	m.Kind, m.Version = Kind, 1
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	stem := fmt.Sprintf("%s-%016x", m.Created.UTC().Format("20060102T150405Z"), m.GUID)
	m.Stream = stem + ".zstream"

	send := z.Send
	if m.KeyID != "" {
		send = z.SendRaw // encrypted: the stream stays ciphertext
	}
	h := sha256.New()
	streamPath := filepath.Join(idDir, m.Stream)
	err := durable.WriteFile(streamPath, 0o600, func(w io.Writer) error {
		cw := &countWriter{w: io.MultiWriter(w, h)}
		if err := send(ctx, snapshot, base, cw); err != nil {
			return fmt.Errorf("sending %s: %w", snapshot, err)
		}
		m.Size = cw.n
		return nil
	})
	if err != nil {
		// Nothing, or a stream not known to be on disk: it goes.
		os.Remove(streamPath)
		return m, err
	}
	m.SHA256 = hex.EncodeToString(h.Sum(nil))
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		os.Remove(streamPath)
		return m, err
	}
	m.path = filepath.Join(idDir, stem+".json")
	err = durable.WriteFile(m.path, 0o600, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		// A manifest not known to be on disk goes (it could name a
		// stream that is gone after a crash), and a stream without its
		// manifest is no backup: no reader takes it.
		os.Remove(m.path)
		os.Remove(streamPath)
		return m, err
	}
	return m, nil
}

// Verify re-reads a stream and checks its size and SHA-256 against its
// manifest; the error matches ErrCorrupt when they differ.
func Verify(m Manifest) error {
	f, err := os.Open(m.StreamPath())
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	return check(m, n, h)
}

func check(m Manifest, n int64, h hash.Hash) error {
	if n != m.Size {
		return fmt.Errorf("%w: %s is %d bytes, its manifest says %d", ErrCorrupt, m.StreamPath(), n, m.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != m.SHA256 {
		return fmt.Errorf("%w: %s has SHA-256 %s, its manifest says %s", ErrCorrupt, m.StreamPath(), sum, m.SHA256)
	}
	return nil
}

// Receive verifies every stream of chain (see Chain) and then receives
// them, in order, into target (which must not exist): a damaged stream is
// found before anything is received. zfs itself refuses a stream that is
// damaged after the check; what it received of the chain then stays in
// target, and the caller destroys it.
func Receive(ctx context.Context, z Receiver, chain []Manifest, target string) error {
	if len(chain) == 0 {
		return errors.New("no backup to receive")
	}
	if chain[0].BaseGUID != 0 {
		return fmt.Errorf("the chain starts with an incremental stream (%s)", chain[0].Path())
	}
	for _, m := range chain {
		if err := Verify(m); err != nil {
			return err
		}
	}
	for _, m := range chain {
		f, err := os.Open(m.StreamPath())
		if err != nil {
			return err
		}
		err = z.Receive(ctx, target, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("receiving %s into %s: %w", m.StreamPath(), target, err)
		}
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
