package record

import (
	"os"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestTransitions_MatchTheDocs holds docs/release-lifecycle.md to the
// table: its "Transitions" section shows exactly Transitions, row by row,
// and its table of states names every state a transition records.
func TestTransitions_MatchTheDocs(t *testing.T) {
	b, err := os.ReadFile("../../docs/release-lifecycle.md")
	must.NoError(t, err)
	doc := string(b)
	must.StrContains(t, doc, "\n"+transitionsMarkdown()+"\n",
		must.Sprintf("docs/release-lifecycle.md (Transitions) must show the table as record.Transitions has it:\n%s", transitionsMarkdown()))
	for _, tr := range Transitions {
		if tr.To != "" {
			must.StrContains(t, doc, "| "+stateCell(tr.To)+" |", must.Sprintf("state %q in the table of states", tr.To))
		}
	}
}

func TestTransitions_EveryEventOnce(t *testing.T) {
	seen := map[Event]bool{}
	for _, tr := range Transitions {
		must.False(t, seen[tr.Event], must.Sprintf("event %q twice", tr.Event))
		seen[tr.Event] = true
		must.Eq(t, tr.To, To(tr.Event))
		must.SliceNotEmpty(t, tr.From)
		must.NotEq(t, "", tr.By)
	}
	must.Eq(t, StateArchived, To(Release))
	must.Eq(t, StateDestroying, To(ReleaseDestroy))
	must.Eq(t, StateFree, To(Create))
}

func TestStateOf(t *testing.T) {
	for _, tc := range []struct {
		stored, owner string
		want          State
	}{
		{ArmedValue("r1.1"), "", StateFree},
		{ArmedValue("r1.1"), "-", StateFree},
		{ArmedValue("r1.1"), "alloc=x", StateReserved},
		{"reserved", "", StateReserved},
		{"archived", "alloc=x", StateArchived},
		{"", "", ""},
	} {
		must.Eq(t, tc.want, StateOf(tc.stored, tc.owner), must.Sprintf("%q %q", tc.stored, tc.owner))
	}
	token, ok := ArmedToken(ArmedValue("abc.2"))
	must.True(t, ok)
	must.Eq(t, "abc.2", token)
	_, ok = ArmedToken("free")
	must.False(t, ok)
}

func transitionsMarkdown() string {
	var b strings.Builder
	b.WriteString("| event | from | to | by |\n|---|---|---|---|\n")
	for _, tr := range Transitions {
		from := make([]string, len(tr.From))
		for i, s := range tr.From {
			from[i] = stateCell(s)
		}
		to := stateCell(tr.To)
		if tr.To == "" {
			to = "(destroyed)"
		}
		b.WriteString("| " + string(tr.Event) + " | " + strings.Join(from, ", ") + " | " + to + " | " + tr.By + " |\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func stateCell(s State) string {
	switch s {
	case "":
		return "(none)"
	case StateArmed:
		return "`" + ArmedValue("<run>.<n>") + "`"
	}
	return "`" + string(s) + "`"
}
