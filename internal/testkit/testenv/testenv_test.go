package testenv

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// recorder is a testing.TB that records Skipf and Fatalf instead of ending
// the test, so that Skip's choice can be checked.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestSkip(t *testing.T) {
	cases := []struct {
		name        string
		ci          string
		short       bool
		call        func(t testing.TB, short bool)
		wantSkipped string
		wantFailed  string
	}{
		{
			name: "missing part, no CI", ci: "",
			call:        func(t testing.TB, _ bool) { Skip(t, "no zpool") },
			wantSkipped: "skipping: no zpool",
		},
		{
			name: "missing part, CI=true", ci: "true",
			call:       func(t testing.TB, _ bool) { Skip(t, "no zpool") },
			wantFailed: "cannot run under CI=true, where nothing may skip: no zpool",
		},
		{
			name: "CI set to something else skips", ci: "1",
			call:        func(t testing.TB, _ bool) { Skip(t, "no zpool") },
			wantSkipped: "skipping: no zpool",
		},
		{
			name: "-short, no CI", ci: "", short: true,
			call:        func(t testing.TB, short bool) { skipShort(t, short, "starts an agent") },
			wantSkipped: "skipping: -short: starts an agent",
		},
		{
			name: "-short, CI=true", ci: "true", short: true,
			call:       func(t testing.TB, short bool) { skipShort(t, short, "starts an agent") },
			wantFailed: "cannot run under CI=true, where nothing may skip: -short: starts an agent",
		},
		{
			name: "not -short runs", ci: "true", short: false,
			call: func(t testing.TB, short bool) { skipShort(t, short, "starts an agent") },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			tc.call(r, tc.short)
			must.EqOp(t, tc.wantSkipped, r.skipped)
			must.EqOp(t, tc.wantFailed, r.failed)
		})
	}
}

// TestEverySkipGoesThroughTestenv parses every Go file of the module and
// fails on a direct t.Skip, t.Skipf, t.SkipNow or testing.Short outside this
// package: such a skip would pass silently under CI=true.
func TestEverySkipGoesThroughTestenv(t *testing.T) {
	root := moduleRoot(t)
	self, err := filepath.Abs(".")
	must.NoError(t, err)
	var found []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			switch {
			case path == self,
				path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor"):
				return filepath.SkipDir
			case path != root && exists(filepath.Join(path, "go.mod")):
				return filepath.SkipDir // another module (e2e/nomad)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if what := directSkip(n); what != "" {
				pos := fset.Position(n.Pos())
				rel, _ := filepath.Rel(root, pos.Filename)
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, pos.Line, what))
			}
			return true
		})
		return nil
	})
	must.NoError(t, err)
	must.SliceEmpty(t, found, must.Sprintf("skip through testenv.Skip or testenv.SkipShort (zfstest.Unavailable does) so that CI=true fails instead:\n%s", strings.Join(found, "\n")))
}

// directSkip names the skip that n calls directly, or returns "".
func directSkip(n ast.Node) string {
	call, ok := n.(*ast.CallExpr)
	if !ok {
		return ""
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	x, _ := sel.X.(*ast.Ident)
	switch {
	case x != nil && x.Name == "testenv":
		return ""
	case sel.Sel.Name == "Skip", sel.Sel.Name == "Skipf", sel.Sel.Name == "SkipNow":
		return "." + sel.Sel.Name
	case x != nil && x.Name == "testing" && sel.Sel.Name == "Short":
		return "testing.Short"
	}
	return ""
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	must.NoError(t, err)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/nomad-device-zfs/nomad-device-zfs\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of the module in or above the package directory")
		}
		dir = parent
	}
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }
