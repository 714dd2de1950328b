package durable

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
)

func TestWriteFile(t *testing.T) {
	errFill := errors.New("fill failed")
	for _, tc := range []struct {
		name    string
		before  string // "" = no file before
		fill    string
		fillErr error
		want    string
	}{
		{name: "new file", fill: "key", want: "key"},
		{name: "replaces a file whole", before: "old", fill: "new", want: "new"},
		{name: "a failed fill leaves the old file", before: "old", fill: "part", fillErr: errFill, want: "old"},
		{name: "a failed fill leaves no file", fill: "part", fillErr: errFill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if tc.before != "" {
				must.NoError(t, os.WriteFile(path, []byte(tc.before), 0o644))
			}
			err := WriteFile(path, 0o600, func(w io.Writer) error {
				_, err := io.WriteString(w, tc.fill)
				if err != nil {
					return err
				}
				return tc.fillErr
			})
			must.ErrorIs(t, err, tc.fillErr)
			entries, rerr := os.ReadDir(dir)
			must.NoError(t, rerr)
			if tc.want == "" {
				must.SliceEmpty(t, entries, must.Sprint("nothing is left behind"))
				return
			}
			must.SliceLen(t, 1, entries, must.Sprint("no temporary file is left behind"))
			b, rerr := os.ReadFile(path)
			must.NoError(t, rerr)
			must.Eq(t, tc.want, string(b))
			if tc.fillErr == nil {
				fi, serr := os.Stat(path)
				must.NoError(t, serr)
				must.Eq(t, os.FileMode(0o600), fi.Mode().Perm())
			}
		})
	}
}
