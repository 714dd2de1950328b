package allocwatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// referenceLean is encoding/json's own decoding of the list, one element
// at a time into leanAlloc, with leanAllocList's strictness (an array of
// objects, nothing after it): what leanAnswers did before the scanner
// (BenchmarkAllocationList's "element-wise").
func referenceLean(r io.Reader) ([]byte, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("not an array: %v", tok)
	}
	list := []*leanAlloc{}
	for dec.More() {
		var a *leanAlloc
		if err := dec.Decode(&a); err != nil {
			return nil, err
		}
		if a == nil {
			return nil, fmt.Errorf("null element")
		}
		list = append(list, a)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the list")
	}
	return json.Marshal(list)
}

// wholeLean is what leanAllocList must agree with: json.Unmarshal of the
// whole answer (as the api package would decode it) into leanAlloc, with
// leanAllocList's strictness.
func wholeLean(in []byte) ([]byte, error) {
	if t := bytes.TrimLeft(in, " \t\r\n"); len(t) == 0 || t[0] != '[' {
		return nil, fmt.Errorf("not an array")
	}
	var list []*leanAlloc
	if err := json.Unmarshal(in, &list); err != nil {
		return nil, err
	}
	for _, a := range list {
		if a == nil {
			return nil, fmt.Errorf("null element")
		}
	}
	if list == nil {
		list = []*leanAlloc{}
	}
	return json.Marshal(list)
}

// agree fails unless leanAllocList and wholeLean both refuse in, or both
// make the same lean list of it. (referenceLean, element by element, would
// also do, but for one thing: it counts nesting from each element, one
// level short of a decode of the whole answer.)
func agree(t *testing.T, in []byte) {
	t.Helper()
	got, gerr := leanAllocList(bytes.NewReader(in))
	want, werr := wholeLean(in)
	if werr != nil || gerr != nil {
		must.True(t, werr != nil && gerr != nil, must.Sprintf("input %q\nencoding/json: %v\nscanner: %v", in, werr, gerr))
		return
	}
	must.EqOp(t, string(want), string(got), must.Sprintf("input %q", in))
}

// TestLeanScan_AgreesWithEncodingJSON: the scanner drops what encoding/json
// would have ignored and keeps what it would have decoded, on shapes that
// try to make the two part: a member name in another case or escaped, a
// member given twice, a forged member inside a string of the job (which a
// tenant writes), escapes and numbers of every kind, bad syntax inside a
// dropped value.
func TestLeanScan_AgreesWithEncodingJSON(t *testing.T) {
	for _, c := range craftedLists {
		agree(t, []byte(c))
	}
}

// craftedLists are the shapes of TestLeanScan_AgreesWithEncodingJSON, and
// seeds of FuzzLeanScan.
var craftedLists = []string{
	`[]`, ` [ ] `, `[{}]`, `[{},{}]`,
	`[{"ID":"a"}]`,
	`[{"id":"a","clientstatus":"complete"}]`,
	`[{"\u0049D":"a","Client\u0053tatus":"running"}]`,
	`[{"ID":"a","ID":"b"}]`,
	`[{"ClientStatus":"running","clientSTATUS":"complete"}]`,
	`[{"ſtatus":"x","Taſkstates":{"t":{"State":"dead"}}}]`, // encoding/json folds ſ to s
	`[{"ID":"a","Job":{"Meta":{"m":"\",\"ClientStatus\":\"complete"}},"ClientStatus":"running"}]`,
	`[{"ID":"a","Job":{"Meta":{"m":"\\\",\"ClientStatus\":\"complete"}},"ClientStatus":"running"}]`,
	`[{"ID":"a","Job":{"Meta":{"m":"\\"},"ClientStatus":"complete"},"ClientStatus":"running"}]`,
	`[{"ID":"a","Job":"\ud800\u00e9\/\b\f\n\r\t"}]`,
	`[{"ID":"a","Job":"\x"}]`,
	`[{"ID":"a","Job":"\u12G4"}]`,
	"[{\"ID\":\"a\",\"Job\":\"tab\there\"}]",
	`[{"ID":"a","Job":[1,-0,0.5,-1.5e10,2E-3,1e+2,123456789012345678901234567890]}]`,
	`[{"ID":"a","Job":01}]`, `[{"ID":"a","Job":1.}]`, `[{"ID":"a","Job":-}]`, `[{"ID":"a","Job":1e}]`,
	`[{"ID":"a","Job":.5}]`, `[{"ID":"a","Job":+1}]`, `[{"ID":"a","Job":1-2}]`,
	`[{"ID":"a","Job":tru}]`, `[{"ID":"a","Job":nul}]`, `[{"ID":"a","Job":true,"X":false,"Y":null}]`,
	`[{"ID":"a","Job":{"a":1,}}]`, `[{"ID":"a","Job":[1,]}]`, `[{"ID":"a",}]`, `[{"ID":"a"},]`,
	`[{"ID":"a","Job":{"a" 1}}]`, `[{"ID":"a","Job":{1:2}}]`, `[{"ID":"a" "Job":1}]`,
	`[{"ID":7}]`, `[{"TaskStates":[]}]`, `[{"AllocatedResources":{"Tasks":{"t":{"Devices":[{"Vendor":"zfs","Type":"dataset","DeviceIDs":["scratch-0"]}]}}}}]`,
	// Members kept in part: a task's state without its events, a
	// task's resources with only its devices.
	`[{"TaskStates":{"t":{"State":"running","Events":[{"Type":"x","Details":{"m":"\"}"}}],"StartedAt":"2026-11-29T15:00:00Z","Failed":false}}}]`,
	`[{"TaskStates":{"t":{"state":"dead","STARTEDAT":"2026-11-29T15:00:00.5Z","State":"running"},"u":null}}]`,
	`[{"TaskStates":{"t":{"StartedAt":"yesterday"}}}]`, `[{"TaskStates":{"t":{"State":5}}}]`, `[{"TaskStates":{"t":[]}}]`,
	`[{"TaskStates":[{"State":"dead"}]}]`, `[{"TaskStates":"x"}]`, `[{"TaskStates":{"t":{"St\u0061te":"dead"}}}]`,
	`[{"AllocatedResources":{"Shared":{"Networks":[{"IP":"1"}]},"tasks":{"t":{"Cpu":{"CpuShares":100},"devices":[{"vendor":"zfs","Type":"dataset","Name":"x","deviceIDs":["scratch-1"]}]}}}}]`,
	`[{"AllocatedResources":{"Tasks":{"t":{"Devices":[{"DeviceIDs":["a",7]}]}}}}]`,
	`[{"AllocatedResources":{"Tasks":{"t":{"Devices":{"DeviceIDs":["a"]}}}}}]`,
	`[{"AllocatedResources":{"Tasks":{"t":{"Devices":[null,{"Vendor":"zfs"}]}}}}]`,
	`[{"AllocatedResources":{"Tasks":{"t":{"Devices":[{"Vendor":"zfs"}],"Devices":[{"Type":"dataset"}]}}}}]`,
	`[{"ID":"a"}]x`, `[{"ID":"a"}] `, `[{"ID":"a"}`, `[{"ID":"a"`, `[{"ID":`, `[{`, `[`, ``, `null`, `[null]`, `[7]`, `["a"]`, `[[]]`,
	`[{"ID":"a","Job":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}]`,
	`[{"ID":"a","Job":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}]`,
	// The depth limit counts the list's own bracket, as a decode of
	// the whole answer does: 9998 more levels pass, 9999 do not.
	`[{"Job":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}]`,
	`[{"Job":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}]`,
}

// TestLeanScan_MutatedAnswers: on thousands of mutations of the saved real
// answer (a byte dropped, doubled, or replaced by one of JSON's own), the
// scanner and encoding/json agree. The seed is fixed: a failure repeats.
func TestLeanScan_MutatedAnswers(t *testing.T) {
	full, err := os.ReadFile(savedAnswer)
	must.NoError(t, err)
	agree(t, full)
	const alphabet = "\"\\{}[],: \n0123456789-.eE+tfnul/b"
	rng := rand.New(rand.NewPCG(10, 26))
	for range 3000 {
		in := bytes.Clone(full)
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(in))
			switch rng.IntN(3) {
			case 0:
				in = append(in[:i], in[i+1:]...)
			case 1:
				in = append(in[:i+1], in[i:]...)
			default:
				in[i] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		agree(t, in)
	}
}

// FuzzLeanScan: `go test -fuzz FuzzLeanScan ./internal/allocwatch` looks
// for an input on which the two part; `go test` runs the seeds.
func FuzzLeanScan(f *testing.F) {
	full, err := os.ReadFile(savedAnswer)
	must.NoError(f, err)
	f.Add(full)
	for _, c := range craftedLists {
		if len(c) < 1000 {
			f.Add([]byte(c))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) { agree(t, in) })
}
