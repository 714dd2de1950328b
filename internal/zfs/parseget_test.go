package zfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// valuesProps is the property list of the get-values capture (the same as
// getValuesProps in capture_test.go, which made it): "name" last, as
// Client.get asks for it.
var valuesProps = []string{"mounted", "used", "x:y", "x:z", "name"}

// parseByName parses a capture and returns its datasets by name relative to
// <pool>/nomad (the captures come from pools with random names), and that
// root's full name.
func parseByName(t *testing.T, file string, props []string) (map[string]Dataset, string) {
	t.Helper()
	out := readTestdata(t, file)
	pool, _, ok := strings.Cut(string(out), "/")
	must.True(t, ok)
	root := pool + "/nomad"
	ds, err := ParseGet(out, props)
	must.NoError(t, err)
	byRel := make(map[string]Dataset)
	for _, d := range ds {
		rel := strings.TrimPrefix(strings.TrimPrefix(d.Name, root), "/")
		_, dup := byRel[rel]
		must.False(t, dup)
		byRel[rel] = d
	}
	return byRel, root
}

// Real zfs-fuse output of datasets whose user property x:y holds a TAB, a
// newline, both, or a forged block of another dataset (see
// capture_test.go): the clean datasets read normally, a TAB is recovered
// exactly, and every dataset whose lines cannot be trusted carries Err,
// including the forged victim and the phantom that does not exist.
func TestParseGet_ValuesWithTabsAndNewlines(t *testing.T) {
	byRel, root := parseByName(t, "get-values-zfs-fuse-0.7.txt", valuesProps)
	cases := []struct {
		rel   string
		clean bool
		value string // x:y of a clean dataset
	}{
		{"", true, "-"},
		{"clean0", true, "plain"},
		{"tab", true, "a\tb"},
		{"zclean", true, "plain"},
		{"blank", false, ""},   // "\n\nq": an empty line inside
		{"newline", false, ""}, // "a\nb"
		{"tabnl", false, ""},   // "a\tb\nc": the first line parses, wrongly
		{"evil", false, ""},    // holds a forged block of victim
		{"victim", false, ""},  // forged inside evil, then its real block
		{"evil2", false, ""},   // holds a forged block of phantom
		{"phantom", false, ""}, // does not exist
	}
	must.MapLen(t, len(cases), byRel) // and no snapshot (newline@s)
	for _, tc := range cases {
		t.Run("dataset "+tc.rel, func(t *testing.T) {
			d, ok := byRel[tc.rel]
			must.True(t, ok)
			if !tc.clean {
				must.ErrorIs(t, d.Err, ErrMalformed)
				must.StrContains(t, d.Err.Error(), d.Name)
				return
			}
			must.NoError(t, d.Err)
			must.MapLen(t, len(valuesProps), d.Props)
			must.Eq(t, Prop{Value: tc.value, Source: map[bool]string{true: "-", false: "local"}[tc.value == "-"]}, d.Props["x:y"])
			must.Eq(t, d.Name, d.Props["name"].Value)
			must.Eq(t, "yes", d.Props["mounted"].Value)
		})
	}
	must.StrContains(t, byRel["victim"].Err.Error(), "after unparseable lines of "+root+"/evil ")
	must.StrContains(t, byRel["phantom"].Err.Error(), "after unparseable lines of "+root+"/evil2 ")
}

// Why Client.get asks for "name" last: a forged block placed in the value of
// the last property asked for is complete and clean, and nothing in the
// output tells it apart. The same forgery with "name" asked for last is
// found (TestParseGet_ValuesWithTabsAndNewlines: phantom).
func TestParseGet_ForgeryNeedsNameLast(t *testing.T) {
	byRel, _ := parseByName(t, "get-forged-noname-zfs-fuse-0.7.txt", valuesProps[:len(valuesProps)-1])
	must.MapLen(t, 2, byRel)
	must.NoError(t, byRel["evil2"].Err)
	must.NoError(t, byRel["phantom"].Err) // undetectable without "name" last
	must.Eq(t, "w", byRel["evil2"].Props["x:z"].Value)
}

// Hand-made shapes that the captures do not show.
func TestParseGet_Anomalies(t *testing.T) {
	props := []string{"used", "x:y", "name"}
	rec := func(name, prop, value, source string) string {
		return name + "\t" + prop + "\t" + value + "\t" + source + "\n"
	}
	block := func(name, xy string) string {
		return rec(name, "used", "1", "-") + rec(name, "x:y", xy, "local") + rec(name, "name", name, "-")
	}
	cases := []struct {
		name  string
		props []string
		in    string
		bad   []string // the datasets with Err; every other one is clean
	}{
		{"clean", props, block("t/a", "1") + block("t/b", "2"), nil},
		{"newline in the first property", props,
			block("t/a", "1") + "t/b\tused\t1\n2\t-\n" + rec("t/b", "x:y", "v", "local") + rec("t/b", "name", "t/b", "-") + block("t/c", "3"),
			[]string{"t/b"}},
		{"newline value in a snapshot", props,
			block("t/a", "1") + "t/a@s\tused\t0\t-\nt/a@s\tx:y\ta\nb\tinherited from t/a\n" + rec("t/a@s", "name", "t/a@s", "-") + block("t/b", "2"),
			nil},
		{"a line that is no dataset name", props,
			block("t/a", "1") + "t/b\tused\t1\t-\nt/b\tx:y\tx\n/etc/passwd\tused\t1\t-\nend\tlocal\n" + rec("t/b", "name", "t/b", "-") + block("t/c", "3"),
			[]string{"t/b"}},
		{"forged block of an earlier dataset", props,
			block("t/a", "1") + "t/b\tused\t1\t-\nt/b\tx:y\tv\tlocal\n" + block("t/a", "stolen") + "t/b\tx:y\tw\tlocal\n" + rec("t/b", "name", "t/b", "-") + block("t/c", "3"),
			[]string{"t/a", "t/b"}},
		{"block cut short, then a new one", props,
			block("t/a", "1") + "t/b\tused\t1\t-\n" + block("t/c", "3") + block("t/d", "4"),
			[]string{"t/b", "t/c", "t/d"}},
		{"a dataset twice in a row", props, block("t/a", "1") + block("t/a", "1") + block("t/b", "2"), []string{"t/a"}},
		// Without a last property that cannot hold a newline, the lines
		// of t/a never resume: every later block may be forged.
		{"newline in the last property asked for", []string{"used", "x:y"},
			"t/a\tused\t1\t-\nt/a\tx:y\ta\nb\tlocal\nt/b\tused\t1\t-\nt/b\tx:y\t2\tlocal\n",
			[]string{"t/a", "t/b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := ParseGet([]byte(tc.in), tc.props)
			must.NoError(t, err)
			var bad []string
			for _, d := range ds {
				must.StrNotContains(t, d.Name, "@")
				if d.Err != nil {
					bad = append(bad, d.Name)
				}
			}
			must.Eq(t, tc.bad, bad)
		})
	}
}

func TestParseGetExact(t *testing.T) {
	evil := string(readTestdata(t, "getexact-evil-zfs-fuse-0.7.txt"))
	cases := []struct {
		name, in string
		want     Prop
		wantErr  string
	}{
		{name: "TAB and newline", in: string(readTestdata(t, "getexact-tabnl-zfs-fuse-0.7.txt")), want: Prop{Value: "a\tb\nc", Source: "local"}},
		{name: "forged block", in: evil, want: Prop{Value: strings.TrimSuffix(evil, "\tlocal\n"), Source: "local"}},
		{name: "unset", in: string(readTestdata(t, "getexact-unset-zfs-fuse-0.7.txt")), want: Prop{Value: "-", Source: "-"}},
		{name: "empty value", in: "\tlocal\n", want: Prop{Value: "", Source: "local"}},
		{name: "no newline", in: "a\tlocal", wantErr: "does not end with a newline"},
		{name: "no TAB", in: "a\n", wantErr: "has no TAB"},
		{name: "empty", in: "", wantErr: "does not end with a newline"},
		{name: "two lines after the TAB", in: "a\tlocal\n\n", wantErr: "no plausible source"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseGetExact([]byte(tc.in))
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				must.ErrorIs(t, err, ErrMalformed)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
	must.StrContains(t, evil, "\tx:y\tstolen\t") // the capture holds the forgery
}

// FuzzParseGet feeds arbitrary output: ParseGet never panics, and what it
// returns is well formed. The seeds are the saved captures.
func FuzzParseGet(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "get-*.txt"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "mounted,used,x:y,x:z,name")
		f.Add(b, strings.Join(savedProps, ","))
	}
	f.Add([]byte("t/a\tused\t1\t-\nt/a\tx:y\ta\nb\tlocal\n"), "used,x:y")
	f.Fuzz(func(t *testing.T, out []byte, propList string) {
		props := strings.Split(propList, ",")
		ds, err := ParseGet(out, props)
		if err != nil {
			return
		}
		for i, d := range ds {
			if !plausibleName(d.Name) || strings.Contains(d.Name, "@") {
				t.Fatalf("dataset name %q", d.Name)
			}
			if i > 0 && ds[i-1].Name >= d.Name {
				t.Fatalf("not sorted or not unique: %q then %q", ds[i-1].Name, d.Name)
			}
			for p := range d.Props {
				if !slices.Contains(props, p) {
					t.Fatalf("property %q not asked for", p)
				}
			}
			if d.Err == nil && len(d.Props) != len(slices.Compact(slices.Sorted(slices.Values(props)))) {
				t.Fatalf("clean dataset %s has %d properties, want %v", d.Name, len(d.Props), props)
			}
		}
	})
}

// forgeryVocab is what FuzzParseGetForgery builds values from: one token
// per input byte, so that the fuzzer composes record-like lines quickly.
var forgeryVocab = []string{"\n", "\t", "t/a", "t/b", "t/c", "t/d", "t/p", "t/a@s", "used", "x:y", "x:z", "name",
	"local", "-", "1", "v", "\t-\n", "\tlocal\n", "/", " "}

// FuzzParseGetForgery prints four datasets the way zfs does, with user
// property values built from fuzzed tokens and "name" last (as Client.get
// asks), and checks that a dataset that comes back without Err is real and
// holds exactly its values, whatever the values imitate; and that without
// newlines in the values every dataset comes back clean.
func FuzzParseGetForgery(f *testing.F) {
	tokens := func(ts ...int) []byte {
		b := make([]byte, len(ts))
		for i, t := range ts {
			b[i] = byte(t)
		}
		return b
	}
	f.Add(tokens(15), tokens(1), tokens(14))
	f.Add(tokens(15, 0, 15), tokens(15), tokens(15))
	// t/a's x:y: "v<TAB>local", then a complete block of t/c, then a
	// record of t/a that takes the real source.
	f.Add(tokens(15, 17, 4, 1, 8, 1, 14, 16, 4, 1, 9, 1, 15, 17, 4, 1, 10, 1, 13, 16, 4, 1, 11, 1, 4, 16, 2, 1, 10, 1, 15), tokens(15), tokens(15))
	// The same with t/a's own block completed first, then a complete block
	// of t/p, which does not exist: only t/a showing up again reveals it.
	f.Add(tokens(15, 17, 2, 1, 10, 1, 13, 16, 2, 1, 11, 1, 2, 16, 6, 1, 8, 1, 14, 16, 6, 1, 9, 1, 15, 17, 6, 1, 10, 1, 13, 16, 6, 1, 11, 1, 6, 16, 2, 1, 9, 1, 15), tokens(15), tokens(15))
	f.Add(tokens(15), tokens(15, 17, 6, 1, 8, 1, 14, 16, 6, 1, 9, 1, 15, 17, 6, 1, 10, 1, 13), tokens(15))
	props := []string{"used", "x:y", "x:z", "name"}
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		value := func(in []byte) string {
			var s strings.Builder
			for _, x := range in {
				s.WriteString(forgeryVocab[int(x)%len(forgeryVocab)])
			}
			return s.String()
		}
		names := []string{"t/a", "t/b", "t/c", "t/d"}
		// The fuzzed values go to x:y of t/a, x:z of t/b, x:y of t/c.
		xy := []string{value(a), "plain", value(c), "plain"}
		xz := []string{"plain", value(b), "plain", "plain"}
		want := map[string]map[string]Prop{}
		var out strings.Builder
		for i, n := range names {
			want[n] = map[string]Prop{
				"used": {"1", "-"}, "x:y": {xy[i], "local"}, "x:z": {xz[i], "local"}, "name": {n, "-"},
			}
			for _, p := range props {
				pr := want[n][p]
				out.WriteString(n + "\t" + p + "\t" + pr.Value + "\t" + pr.Source + "\n")
			}
		}
		ds, err := ParseGet([]byte(out.String()), props)
		if err != nil {
			t.Fatalf("ParseGet: %v", err)
		}
		newline := strings.Contains(strings.Join(append(xy, xz...), ""), "\n")
		for _, d := range ds {
			if d.Err != nil {
				if !newline {
					t.Fatalf("%s flagged without any newline in a value: %v", d.Name, d.Err)
				}
				continue
			}
			w, real := want[d.Name]
			if !real {
				t.Fatalf("forged dataset %q came back clean: %v\noutput:\n%s", d.Name, d.Props, out.String())
			}
			for p, pr := range w {
				if d.Props[p] != pr {
					t.Fatalf("%s %s: got %q, want %q\noutput:\n%s", d.Name, p, d.Props[p], pr, out.String())
				}
			}
		}
		if !newline && len(ds) != len(names) {
			t.Fatalf("got %d datasets, want %d", len(ds), len(names))
		}
	})
}
