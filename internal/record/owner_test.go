package record

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestOwner_EncodeDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Owner
		enc  string
	}{
		{"a service's allocation",
			Owner{AllocID: "a1", Namespace: "default", Job: "web", Group: "g", Task: "t", AllocName: "web.g[0]", NodeID: "n1"},
			"alloc=a1&group=g&job=web&name=web.g%5B0%5D&node=n1&ns=default&task=t"},
		{"a dispatched run records its parent",
			Owner{AllocID: "a2", Namespace: "default", Job: "runner/dispatch-1733400000-0b1c2d3e", Group: "g", Task: "w",
				AllocName: "runner/dispatch-1733400000-0b1c2d3e.g[0]", Parent: "runner"},
			"alloc=a2&group=g&job=runner%2Fdispatch-1733400000-0b1c2d3e&name=runner%2Fdispatch-1733400000-0b1c2d3e.g%5B0%5D&ns=default&parent=runner&task=w"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.enc, tc.o.Encode())
			got, err := DecodeOwner(tc.enc)
			must.NoError(t, err)
			must.Eq(t, tc.o, got)
		})
	}
	// What an earlier build recorded (no parent) decodes as it was.
	got, err := DecodeOwner("alloc=a3&job=nightly%2Fperiodic-1733400000&name=nightly%2Fperiodic-1733400000.g%5B0%5D")
	must.NoError(t, err)
	must.EqOp(t, "", got.Parent)
	must.EqOp(t, "nightly/periodic-1733400000", got.IdentityJob())
}

// TestSameIdentity: the runs of one periodic or dispatched parent are one
// identity, as the allocations of one job are; nothing else is.
func TestSameIdentity(t *testing.T) {
	run := func(alloc, job, parent string) Owner {
		return Owner{AllocID: alloc, Namespace: "default", Job: job, Group: "g", Task: "w", AllocName: job + ".g[0]", Parent: parent}
	}
	long := strings.Repeat("p", MaxOwnerField)
	for _, tc := range []struct {
		name string
		a, b Owner
		same bool
	}{
		{"two allocations of one job", run("a1", "web", ""), run("a2", "web", ""), true},
		{"two runs of one periodic job", run("a1", "nightly/periodic-1", "nightly"), run("a2", "nightly/periodic-2", "nightly"), true},
		{"two dispatches of one job", run("a1", "runner/dispatch-1-aa", "runner"), run("a2", "runner/dispatch-2-bb", "runner"), true},
		{"runs of two parents", run("a1", "nightly/periodic-1", "nightly"), run("a2", "weekly/periodic-1", "weekly"), false},
		{"a run recorded without its parent (an earlier build)", run("a1", "nightly/periodic-1", ""), run("a2", "nightly/periodic-2", "nightly"), false},
		{"the parent job and one of its runs", run("a1", "nightly", ""), run("a2", "nightly/periodic-2", "nightly"), true},
		{"another namespace", run("a1", "nightly/periodic-1", "nightly"), Owner{AllocID: "a2", Namespace: "other", Job: "nightly/periodic-2", Group: "g", Task: "w", AllocName: "nightly/periodic-2.g[0]", Parent: "nightly"}, false},
		{"a parent name cut when recorded", run("a1", "x/periodic-1", long), run("a2", "x/periodic-2", long), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.same, SameIdentity(tc.a, tc.b))
			must.EqOp(t, tc.same, SameIdentity(tc.b, tc.a))
		})
	}
}
