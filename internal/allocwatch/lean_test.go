package allocwatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// savedAnswer is a real /v1/node/:id/allocations answer of Nomad 1.11.3
// (the demo's agent: one allocation complete, one running, each holding
// the device scratch-0).
const savedAnswer = "testdata/node-allocations-nomad-1.11.3.json"

// TestLeanAllocList_SavedAnswer: the lean list decodes to exactly what the
// whole answer decodes to, and is a fraction of its size.
func TestLeanAllocList_SavedAnswer(t *testing.T) {
	full, err := os.ReadFile(savedAnswer)
	must.NoError(t, err)
	var want []*leanAlloc
	must.NoError(t, json.Unmarshal(full, &want))
	must.Len(t, 2, want)

	lean, err := leanAllocList(bytes.NewReader(full))
	must.NoError(t, err)
	var got []*leanAlloc
	must.NoError(t, json.Unmarshal(lean, &got))
	must.Eq(t, want, got)
	must.Less(t, len(full)/5, len(lean), must.Sprintf("lean %d bytes of %d", len(lean), len(full)))

	// What the watcher makes of it.
	byJob := map[string]*Alloc{}
	for _, a := range got {
		byJob[a.JobID] = convert(a)
	}
	must.MapLen(t, 2, byJob)
	must.Eq(t, map[string]string{"scratch-0": "write"}, byJob["scratch-demo"].Devices)
	must.True(t, byJob["scratch-demo"].Ended("write"))
	must.Eq(t, map[string]string{"scratch-0": "write"}, byJob["scratch-demo-2"].Devices)
	must.False(t, byJob["scratch-demo-2"].Ended("write"))
	must.True(t, byJob["scratch-demo-2"].StartedTasks["write"])
}

func TestLeanAllocList_Shapes(t *testing.T) {
	cases := []struct {
		name, in string
		want     string // the lean JSON; empty when an error is wanted
		err      string
	}{
		{name: "empty list", in: "[]\n", want: "[]"},
		{name: "null", in: "null", err: "want a JSON array, found null"},
		{name: "unknown fields dropped", in: `[{"ID":"a1","Job":{"ID":"j","TaskGroups":[{"Name":"g"}]},"ClientStatus":"running","PreviousAllocation":"a0","NextAllocation":"a2"}]`,
			want: `[{"ID":"a1","Namespace":"","JobID":"","TaskGroup":"","Name":"","ClientStatus":"running","DesiredStatus":"","PreviousAllocation":"a0","Job":{"ParentID":""},"AllocatedResources":null,"TaskStates":null}]`},
		{name: "null element", in: `[{"ID":"a1"},null]`, err: "allocation 1 of the list: want an object, found null"},
		{name: "empty answer", in: "", err: "allocation list: unexpected end of JSON input"},
		{name: "an object", in: `{"ID":"a1"}`, err: "want a JSON array"},
		{name: "a string", in: `"a1"`, err: "want a JSON array"},
		{name: "a number element", in: `[{"ID":"a1"},7]`, err: "allocation 1 of the list"},
		{name: "a wrong field type", in: `[{"ID":7}]`, err: "allocation 0 of the list"},
		{name: "cut short", in: `[{"ID":"a1"},{"ID":`, err: "allocation 1 of the list"},
		{name: "no closing bracket", in: `[{"ID":"a1"}`, err: "allocation list"},
		{name: "data after the list", in: `[{"ID":"a1"}] [`, err: "data after the list"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := leanAllocList(strings.NewReader(tc.in))
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.EqOp(t, tc.want, string(got))
		})
	}
}

// TestLeanAnswers_OnlyTheListIsRewritten: errors keep their status and
// body; other endpoints, encoded answers and requests that read did not
// mark pass as they came; a malformed list fails the request naming the
// path.
func TestLeanAnswers_OnlyTheListIsRewritten(t *testing.T) {
	full, err := os.ReadFile(savedAnswer)
	must.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/node/n1/allocations" && r.Header.Get("X-Test") == "403":
			http.Error(w, "Permission denied", http.StatusForbidden)
		case r.URL.Path == "/v1/node/n1/allocations" && r.Header.Get("X-Test") == "gzip":
			w.Header().Set("Content-Encoding", "gzip")
			w.Write([]byte("not gzip, passed on as it came"))
		case r.URL.Path == "/v1/node/n1/allocations" && r.Header.Get("X-Test") == "bad":
			w.Write([]byte(`[{"ID":"a1"},`))
		default: // the list, and /v1/node/n1 itself
			w.Header().Set("X-Nomad-Index", "42")
			w.Write(full)
		}
	}))
	t.Cleanup(srv.Close)
	// As the watcher's client: no gzip asked for by the transport.
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: leanAnswers{tr}}
	get := func(path, test string) (*http.Response, []byte, error) {
		t.Helper()
		ctx := context.Background()
		if test != "unmarked" {
			ctx = context.WithValue(ctx, leanList{}, true) // as read marks it
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		must.NoError(t, err)
		req.Header.Set("X-Test", test)
		resp, err := client.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		must.NoError(t, err)
		return resp, b, nil
	}

	resp, body, err := get("/v1/node/n1/allocations", "")
	must.NoError(t, err)
	must.EqOp(t, "42", resp.Header.Get("X-Nomad-Index"))
	must.EqOp(t, fmt.Sprint(len(body)), resp.Header.Get("Content-Length"))
	must.Less(t, len(full)/5, len(body))

	for _, tc := range []struct{ path, test, want string }{
		{"/v1/node/n1/allocations", "403", "Permission denied\n"},
		{"/v1/node/n1/allocations", "gzip", "not gzip, passed on as it came"},
		{"/v1/node/n1", "", string(full)},
		{"/v1/node/n1/allocations", "unmarked", string(full)}, // not read's request
	} {
		_, body, err := get(tc.path, tc.test)
		must.NoError(t, err)
		must.EqOp(t, tc.want, string(body))
	}

	_, _, err = get("/v1/node/n1/allocations", "bad")
	must.ErrorContains(t, err, "reading the answer of /v1/node/n1/allocations: allocation 1 of the list")
}

func TestIsNodeAllocations(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/node/f1e2/allocations":      true,
		"/v1/node//allocations":          false,
		"/v1/node/f1e2":                  false,
		"/v1/node/f1e2/allocations/x":    false,
		"/v1/node/a/b/allocations":       false,
		"/v1/allocations":                false,
		"/v1/nodes/f1e2/allocations":     false,
		"/x/v1/node/f1e2/allocations":    false,
		"/v1/node/f1e2/allocationsmore/": false,
	} {
		must.EqOp(t, want, isNodeAllocations(path), must.Sprint(path))
	}
}

// BenchmarkAllocationList decodes a node's list of 160 allocations (the
// saved answer's two, repeated) as the api package alone would (the whole
// answer held, then decoded) and through leanAnswers. Compare B/op.
func BenchmarkAllocationList(b *testing.B) {
	full, err := os.ReadFile(savedAnswer)
	must.NoError(b, err)
	var elems []json.RawMessage
	must.NoError(b, json.Unmarshal(full, &elems))
	var many []json.RawMessage
	for len(many) < 160 {
		many = append(many, elems...)
	}
	body, err := json.Marshal(many)
	must.NoError(b, err)
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out []*leanAlloc
			must.NoError(b, json.NewDecoder(bytes.NewReader(body)).Decode(&out))
		}
	})
	b.Run("element-wise", func(b *testing.B) { // the lean list as encoding/json makes it (referenceLean)
		b.ReportAllocs()
		for b.Loop() {
			lean, err := referenceLean(bytes.NewReader(body))
			must.NoError(b, err)
			var out []*leanAlloc
			must.NoError(b, json.NewDecoder(bytes.NewReader(lean)).Decode(&out))
		}
	})
	b.Run("lean", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			lean, err := leanAllocList(bytes.NewReader(body))
			must.NoError(b, err)
			var out []*leanAlloc
			must.NoError(b, json.NewDecoder(bytes.NewReader(lean)).Decode(&out))
		}
	})
}
