package allocwatch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// leanAnswers decodes the node's allocation list as it streams in, one
// allocation at a time, keeping only the fields of leanAlloc, and hands
// the api package that lean list instead of Nomad's answer.
//
// Why: every allocation in /v1/node/:id/allocations carries its whole job,
// so the answer grows with every allocation the node has had since
// Nomad's last garbage collection (about 10 kB each for a one-task batch
// job), and it is read at the changes of any allocation on the node (at
// most one read per readGap while they keep coming). The api package
// decodes through encoding/json's Decoder, which holds a whole top-level
// value in memory before decoding it. The scanner (leanscan.go) holds one
// allocation's kept members at a time, and checks the rest as JSON
// without building it: a read costs half the CPU of decoding each
// allocation whole (BenchmarkAllocationList), and what it costs in memory
// no longer grows with the node's history.
//
// Only a 200 answer, without Content-Encoding, to a GET of that path made
// by read (which marks its context with leanList) is rewritten; every
// other answer (errors with their status and body, other endpoints, other
// callers) passes as it came. An answer that is not a JSON array of
// objects fails the request with an error naming the path, more strictly
// than the api package's own decoding (which takes null for an empty list
// and ignores what follows the array): the read fails, and the plugin
// keeps every dataset.
type leanAnswers struct{ next http.RoundTripper }

// leanList marks the context of read's request for leanAnswers.
type leanList struct{}

// RoundTrip sends req and, for read's request of the node's allocation
// list, replaces the answer's body with the lean list (see leanAnswers).
func (l leanAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || resp.StatusCode != http.StatusOK ||
		req.Context().Value(leanList{}) == nil || !isNodeAllocations(req.URL.Path) ||
		resp.Header.Get("Content-Encoding") != "" {
		return resp, err
	}
	body, err := leanAllocList(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s: %w", req.URL.Path, err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return resp, nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (l leanAnswers) CloseIdleConnections() {
	if c, ok := l.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// isNodeAllocations reports whether path is /v1/node/<id>/allocations.
func isNodeAllocations(path string) bool {
	id, ok := strings.CutPrefix(path, "/v1/node/")
	if !ok {
		return false
	}
	id, ok = strings.CutSuffix(id, "/allocations")
	return ok && id != "" && !strings.Contains(id, "/")
}

// leanAllocList reads a JSON array of allocations from r one element at a
// time and returns the JSON of the same array with each element cut to
// leanAlloc's fields, and in them to what their types hold (leanShape).
// It decodes exactly what json.Unmarshal into []*leanAlloc decodes
// (TestLeanScan_AgreesWithEncodingJSON), and fails on anything else: input
// that is not JSON, a value that is not an array (null included: Nomad
// answers [] for a node without allocations, and a null read as "no
// allocations" would say every device is free), an element that is not an
// object, or data after the array.
func leanAllocList(r io.Reader) ([]byte, error) {
	s := &scanner{r: bufio.NewReaderSize(r, 64<<10)}
	c, err := s.nonSpace()
	if err != nil {
		return nil, fmt.Errorf("allocation list: %w", err)
	}
	if c != '[' {
		return nil, fmt.Errorf("allocation list: want a JSON array, found %s", kindOf(c))
	}
	s.depth = 1 // the array: an allocation nests as deep as in the whole answer
	list := []*leanAlloc{}
	if c, err = s.nonSpace(); err != nil {
		return nil, fmt.Errorf("allocation list: %w", err)
	}
	for c != ']' {
		if len(list) > 0 {
			if c != ',' {
				return nil, fmt.Errorf("allocation list: invalid character %q after allocation %d", c, len(list)-1)
			}
			if c, err = s.nonSpace(); err != nil {
				return nil, fmt.Errorf("allocation %d of the list: %w", len(list), err)
			}
		}
		if c != '{' {
			return nil, fmt.Errorf("allocation %d of the list: want an object, found %s", len(list), kindOf(c))
		}
		// One element at a time: the scanner holds this element's kept
		// members, not the whole array.
		a, err := s.element()
		if err != nil {
			return nil, fmt.Errorf("allocation %d of the list: %w", len(list), err)
		}
		list = append(list, a)
		if c, err = s.nonSpace(); err != nil {
			return nil, fmt.Errorf("allocation list: %w", err)
		}
	}
	switch _, err := s.nonSpace(); {
	case err == nil:
		return nil, fmt.Errorf("allocation list: data after the list")
	case !errors.Is(err, errCut): // the end of the input is errCut
		return nil, fmt.Errorf("allocation list: after the list: %w", err)
	}
	return json.Marshal(list)
}

// kindOf names the JSON value that starts with c, for errors.
func kindOf(c byte) string {
	switch {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 'n':
		return "null"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == '-' || '0' <= c && c <= '9':
		return "a number"
	}
	return fmt.Sprintf("%q", c)
}
