package allocwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// visibilityDeadline bounds each CheckVisibility call of the tests.
const visibilityDeadline = 20 * time.Second

// visibilityClient is an API client of addr that sends secret (no token
// when empty), whatever NOMAD_TOKEN says.
func visibilityClient(t *testing.T, addr, secret string) *api.Client {
	t.Helper()
	c, err := api.NewClient(&api.Config{Address: addr, TLSConfig: &api.TLSConfig{}})
	must.NoError(t, err)
	c.SetSecretID(secret)
	return c
}

func checkVisibility(t *testing.T, c *api.Client) Visibility {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), visibilityDeadline)
	t.Cleanup(cancel)
	v, err := CheckVisibility(ctx, c)
	must.NoError(t, err)
	t.Logf("All=%v Reason: %s", v.All, v.Reason)
	return v
}

// readmePolicy is the policy the README tells operators to give the plugin.
func readmePolicy(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "acl", "zfs-plugin.policy.hcl"))
	must.NoError(t, err)
	return string(b)
}

// TestVisibility_RealAgentWithACLs runs CheckVisibility against a real
// Nomad agent with ACLs, namespaces "other" and "secret", and client tokens
// of several policies and a role: only tokens that Nomad lets read jobs in
// every namespace (and the node) are All, and each negative reason names
// what is missing.
func TestVisibility_RealAgentWithACLs(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	t.Parallel()
	a := nomadtest.StartAgent(t, nomadtest.Options{ACL: true})
	for _, ns := range []string{"other", "secret"} {
		_, err := a.API.Namespaces().Register(&api.Namespace{Name: ns}, nil)
		must.NoError(t, err)
	}
	const nodeRead = "node {\n  policy = \"read\"\n}\n"
	policies := map[string]string{
		"zfs-plugin":       readmePolicy(t),
		"node-read":        nodeRead,
		"all-jobs":         `namespace "*" { capabilities = ["read-job"] }`,
		"default-only":     nodeRead + `namespace "default" { capabilities = ["read-job"] }`,
		"all-but-secret":   nodeRead + `namespace "*" { capabilities = ["read-job"] }` + "\n" + `namespace "secret" { policy = "deny" }`,
		"all-but-sec-glob": nodeRead + `namespace "*" { capabilities = ["read-job"] }` + "\n" + `namespace "sec*" { policy = "deny" }`,
		"list-only":        nodeRead + `namespace "*" { capabilities = ["list-jobs"] }`,
		"other-blocks":     otherBlocksPolicy,
		"json-dev-denied": `{"node": {"policy": "read"}, "agent": {"policy": "read"},
			"host_volume": {"*": {"policy": "read"}},
			"namespace": {"*": {"capabilities": ["read-job"], "variables": {"path": {"*": {"capabilities": ["read"]}}}},
			              "dev-*": {"policy": "deny"}}}`,
		"shadowed-glob": nodeRead + `namespace "*" { capabilities = ["read-job"] }` + "\n" + `namespace "a*" { policy = "deny" }` + "\n" +
			`namespace "a*x" { policy = "read" }` + "\n" + `namespace "a*zfs-visibility-probe-*" { policy = "read" }`,
	}
	for name, rules := range policies {
		_, err := a.API.ACLPolicies().Upsert(&api.ACLPolicy{Name: name, Rules: rules}, nil)
		must.NoError(t, err, must.Sprintf("policy %s", name))
	}
	role, _, err := a.API.ACLRoles().Create(&api.ACLRole{Name: "zfs-plugin-role",
		Policies: []*api.ACLRolePolicyLink{{Name: "zfs-plugin"}}}, nil)
	must.NoError(t, err)
	other, _, err := a.API.ACLRoles().Create(&api.ACLRole{Name: "unrelated-role",
		Policies: []*api.ACLRolePolicyLink{{Name: "node-read"}}}, nil)
	must.NoError(t, err)
	token := func(name string, roles []string, policies ...string) string {
		t.Helper()
		tok := &api.ACLToken{Name: name, Type: "client", Policies: policies}
		for _, r := range roles {
			tok.Roles = append(tok.Roles, &api.ACLTokenRoleLink{ID: r})
		}
		out, _, err := a.API.ACLTokens().Create(tok, nil)
		must.NoError(t, err, must.Sprintf("token %s", name))
		return out.SecretID
	}
	roleToken := token("through-role", []string{role.ID})

	cases := []struct {
		name   string
		secret string
		all    bool
		reason []string // substrings of Reason
	}{
		{name: "management token", secret: a.Token, all: true, reason: []string{"management token"}},
		{name: "README policy", secret: token("readme", nil, "zfs-plugin"), all: true,
			reason: []string{`"zfs-plugin"`, "every namespace"}},
		{name: "README policy split in two", secret: token("split", nil, "node-read", "all-jobs"), all: true},
		{name: "README policy through a role", secret: roleToken, all: true, reason: []string{`"zfs-plugin"`}},
		{name: "default namespace only", secret: token("default-only", nil, "default-only"),
			reason: []string{`"default-only"`, "namespaces no rule names", `namespace "*"`}},
		{name: "secret denied", secret: token("all-but-secret", nil, "all-but-secret"),
			reason: []string{`namespace "secret"`, `policy "all-but-secret" denies it`}},
		{name: "glob denied", secret: token("all-but-sec-glob", nil, "all-but-sec-glob"),
			reason: []string{`namespaces matching "sec*"`, `policy "all-but-sec-glob" denies it`}},
		{name: "role allows, own policy denies", secret: token("mixed", []string{role.ID}, "all-but-secret"),
			reason: []string{`namespace "secret"`}},
		{name: "list-jobs is not read-job", secret: token("list-only", nil, "list-only"),
			reason: []string{`namespace "default"`, "grants no read-job"}},
		{name: "no node read", secret: token("jobs-only", nil, "all-jobs"), reason: []string{"cannot read the node"}},
		{name: "policy with other blocks", secret: token("other-blocks", nil, "other-blocks"), all: true},
		{name: "JSON policy denies a glob no namespace matches", secret: token("json", nil, "json-dev-denied"),
			reason: []string{`namespaces matching "dev-*"`, `policy "json-dev-denied" denies it`}},
		{name: "glob shadowed at every probe", secret: token("shadowed", nil, "shadowed-glob"),
			reason: []string{`namespaces matching "a*"`, `policy "shadowed-glob" denies it`}},
		{name: "anonymous", secret: "", reason: []string{"cannot read the node"}},
		{name: "unknown token", secret: "00000000-0000-4000-8000-000000000000", reason: []string{"403"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := checkVisibility(t, visibilityClient(t, a.Addr, tc.secret))
			must.EqOp(t, tc.all, v.All, must.Sprint(v.Reason))
			for _, s := range tc.reason {
				must.StrContains(t, v.Reason, s)
			}
			if !tc.all {
				must.StrHasSuffix(t, visibilityGrant, v.Reason)
			}
		})
	}

	// VisibleSince: zero until a check finds every namespace visible, then
	// the start of that check; zero again when the token file changes, and
	// the start of the first check after it that finds them all. A read
	// that began before it may have been made with the token that saw less.
	t.Run("VisibleSince", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		must.NoError(t, os.WriteFile(file, []byte(token("narrow", nil, "default-only")+"\n"), 0o600))
		w := newWatcher(t, a.Addr, Config{TokenFile: file})
		ctx := context.Background()
		must.True(t, w.VisibleSince().IsZero())
		must.False(t, w.Visibility(ctx).All)
		must.True(t, w.VisibleSince().IsZero(), must.Sprint("not known to see every namespace"))

		must.NoError(t, os.WriteFile(file, []byte(token("wide", nil, "zfs-plugin")+"\n\n"), 0o600))
		before := time.Now()
		must.True(t, w.Visibility(ctx).All)
		first := w.VisibleSince()
		must.False(t, first.Before(before), must.Sprint("the check made after the token changed"))
		must.True(t, w.Visibility(ctx).All)
		must.Eq(t, first, w.VisibleSince(), must.Sprint("a cached or repeated check keeps it"))

		must.NoError(t, os.WriteFile(file, []byte(a.Token+"\n\n\n"), 0o600)) // another size: seen as changed whatever the clock
		changed := time.Now()
		must.True(t, w.Visibility(ctx).All)
		must.False(t, w.VisibleSince().Before(changed), must.Sprint("a new token starts it again"))
	})

	// What Nomad 1.11 answers about roles: a client token may read a role
	// linked to it, and gets 403 for any other.
	c := visibilityClient(t, a.Addr, roleToken)
	got, _, err := c.ACLRoles().Get(role.ID, nil)
	must.NoError(t, err)
	must.EqOp(t, "zfs-plugin-role", got.Name)
	_, _, err = c.ACLRoles().Get(other.ID, nil)
	t.Logf("reading a role not linked to the token: %v", err)
	must.EqOp(t, http.StatusForbidden, statusOf(err))
	must.False(t, aclsDisabledAnswer(err))
}

// TestVisibility_RealAgentWithoutACLs runs CheckVisibility against a real
// agent without ACLs: any token (none, or one Nomad never issued) sees
// every namespace. It also pins the two answers that say ACLs are off.
func TestVisibility_RealAgentWithoutACLs(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	t.Parallel()
	a := nomadtest.StartAgent(t, nomadtest.Options{})
	for _, secret := range []string{"", "00000000-0000-4000-8000-000000000000"} {
		v := checkVisibility(t, visibilityClient(t, a.Addr, secret))
		must.True(t, v.All, must.Sprint(v.Reason))
		must.EqOp(t, "ACLs are disabled on the Nomad cluster", v.Reason)
	}

	c := visibilityClient(t, a.Addr, "")
	self, _, err := c.ACLTokens().Self(nil)
	must.NoError(t, err)
	t.Logf("/v1/acl/token/self without ACLs: %+v", *self)
	must.EqOp(t, aclsDisabledAccessor, self.AccessorID)

	_, _, err = c.ACLPolicies().Info("zfs-plugin", nil)
	t.Logf("/v1/acl/policy/zfs-plugin without ACLs: %v", err)
	must.True(t, aclsDisabledAnswer(err), must.Sprintf("got %v", err))
	must.EqOp(t, http.StatusBadRequest, statusOf(err))
}

// TestVisibility_APIFaults covers what a real agent cannot be made to show:
// an API that hangs (CheckVisibility returns an error by the deadline), is
// down, or answers 500. None of them is a Visibility.
func TestVisibility_APIFaults(t *testing.T) {
	hung := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Nomad-Token") {
		case "hang":
			select {
			case <-r.Context().Done():
			case <-hung:
			}
		default:
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hung) })
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()

	cases := []struct {
		name, addr, secret string
		deadline           bool // the error is the context's deadline
	}{
		{name: "hung", addr: srv.URL, secret: "hang", deadline: true},
		{name: "500", addr: srv.URL, secret: "x"},
		{name: "down", addr: down.URL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			v, err := CheckVisibility(ctx, visibilityClient(t, tc.addr, tc.secret))
			t.Logf("after %s: %v", time.Since(start), err)
			must.Error(t, err)
			must.False(t, v.All)
			must.Less(t, 2*time.Second, time.Since(start))
			must.EqOp(t, tc.deadline, errors.Is(err, context.DeadlineExceeded))
		})
	}
}

// TestVisibility_AskFaults covers the questions to Nomad that follow the
// token's policies, against a fake API that gives a client token the README
// policy and lists 20 namespaces: each name is asked once, at most
// visibilityParallel at a time, and an answer other than 200 or 403 leaves
// no verdict: a 404 is a negative Visibility that says what Nomad
// answered, a 500 or a request that hangs is an error, by the deadline.
func TestVisibility_AskFaults(t *testing.T) {
	readme := readmePolicy(t)
	cases := []struct {
		name     string
		node     int // the status of the node question
		jobs     int // the status of the question about namespace n7
		hang     bool
		all      bool
		err      bool
		deadline bool // the error is the context's deadline
		reason   string
	}{
		{name: "every answer 200", node: 200, jobs: 200, all: true},
		{name: "node 403", node: 403, jobs: 200, reason: "cannot read the node"},
		{name: "node 500", node: 500, jobs: 200, err: true},
		{name: "n7 403", node: 200, jobs: 403, reason: `namespace "n7" (policy "p" grants no read-job there through namespace "*")`},
		{name: "n7 404", node: 200, jobs: 404, reason: `namespace "n7" (GET /v1/job/`},
		{name: "n7 500", node: 200, jobs: 500, err: true},
		{name: "n7 hangs", node: 200, jobs: 200, hang: true, err: true, deadline: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu             sync.Mutex
				asked          = map[string]int{}
				inFlight, most int
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reply := func(v any) {
					w.Header().Set("Content-Type", "application/json")
					must.NoError(t, json.NewEncoder(w).Encode(v))
				}
				switch p := r.URL.Path; {
				case p == "/v1/acl/token/self":
					reply(api.ACLToken{AccessorID: "a", Name: "fake", Type: "client", Policies: []string{"p"}})
				case p == "/v1/acl/policy/p":
					reply(api.ACLPolicy{Name: "p", Rules: readme})
				case p == "/v1/namespaces":
					var nss []*api.Namespace
					for i := range 20 {
						nss = append(nss, &api.Namespace{Name: fmt.Sprintf("n%d", i)})
					}
					reply(nss)
				case strings.HasPrefix(p, "/v1/node/") && strings.HasSuffix(p, "/allocations"):
					if tc.node != 200 {
						http.Error(w, "answer", tc.node)
						return
					}
					reply([]any{})
				case strings.HasPrefix(p, "/v1/job/") && strings.HasSuffix(p, "/allocations"):
					ns := r.URL.Query().Get("namespace")
					mu.Lock()
					asked[ns]++
					inFlight++
					most = max(most, inFlight)
					mu.Unlock()
					defer func() {
						mu.Lock()
						inFlight--
						mu.Unlock()
					}()
					time.Sleep(10 * time.Millisecond) // let the questions overlap
					switch {
					case ns == "n7" && tc.hang:
						<-r.Context().Done()
					case ns == "n7" && tc.jobs != 200:
						http.Error(w, "answer", tc.jobs)
					default:
						reply([]any{})
					}
				default:
					http.Error(w, "unexpected "+p, http.StatusTeapot)
				}
			}))
			t.Cleanup(srv.Close)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			v, err := CheckVisibility(ctx, visibilityClient(t, srv.URL, "secret"))
			t.Logf("after %s: All=%v Reason: %s; error: %v", time.Since(start), v.All, v.Reason, err)
			must.Less(t, 3*time.Second, time.Since(start))
			must.EqOp(t, tc.all, v.All)
			must.EqOp(t, tc.err, err != nil)
			must.EqOp(t, tc.deadline, errors.Is(err, context.DeadlineExceeded))
			if tc.reason != "" {
				must.StrContains(t, v.Reason, tc.reason)
				must.StrHasSuffix(t, visibilityGrant, v.Reason)
			}
			mu.Lock()
			defer mu.Unlock()
			for ns, n := range asked {
				must.EqOp(t, 1, n, must.Sprintf("namespace %q", ns))
				must.StrNotContains(t, ns, "*")
				must.NotEq(t, "", ns)
			}
			must.LessEq(t, visibilityParallel, most)
			if tc.all {
				must.MapLen(t, 22, asked, must.Sprint("20 listed, the probe, and the catch-all's own name"))
				must.Greater(t, 1, most, must.Sprint("the questions overlap"))
			}
		})
	}
}

// nomadModel answers as Nomad 1.11 does whether a token may read jobs in
// namespace ns (acl.ACL.AllowNamespaceOperation): by the rule that names
// ns exactly, else by the matching glob with the most literal characters,
// else no. grants is each rule name's read-job, merged across the
// token's policies as Nomad merges them (a deny anywhere wins).
func nomadModel(grants map[string]bool, ns string) bool {
	if g, ok := grants[ns]; ok {
		return g
	}
	best, bestLen := "", -1
	for name := range grants {
		if !strings.Contains(name, "*") || !globMatch(name, ns) {
			continue
		}
		if n := len(name) - strings.Count(name, "*"); n > bestLen || (n == bestLen && name < best) {
			best, bestLen = name, n
		}
	}
	return bestLen >= 0 && grants[best]
}

// evaluate plans the check of a token named "zfs" with policies and gives
// its verdict on the answers of a Nomad that lets the token read the node
// when node is true and reads its namespace rules as grants. It fails t
// when the verdict wants an answer that the plan does not ask Nomad for.
func evaluate(t *testing.T, policies []namedPolicy, listed []string, probe string, node bool, grants map[string]bool) Visibility {
	t.Helper()
	plan, refused := planVisibility("zfs", policies, listed, probe)
	if plan == nil {
		return refused
	}
	asked := map[string]bool{}
	for _, ns := range plan.names {
		must.False(t, asked[ns], must.Sprintf("%q asked twice", ns))
		must.StrNotContains(t, ns, "*")
		asked[ns] = true
	}
	t.Logf("asks Nomad about %q", plan.names)
	return plan.verdict(node, func(ns string) bool {
		must.True(t, node, must.Sprintf("asked about %q without node read", ns))
		must.MapContainsKey(t, asked, ns, must.Sprint("a name the plan does not ask Nomad about"))
		return nomadModel(grants, ns)
	})
}

// TestVisibility_Evaluate checks the plan and the verdict on cases a real
// agent would also accept but that are tedious to set up there: globs that
// tie or shadow, a glob that only looks like a catch-all, merged policies.
// Each case's grants are Nomad's answers for its policies (nomadModel).
func TestVisibility_Evaluate(t *testing.T) {
	const (
		nodeRead = "node {\n  policy = \"read\"\n}\n"
		all      = `namespace "*" { capabilities = ["read-job"] }` + "\n"
		probe    = "zfs-visibility-probe-0123456789ab"
	)
	var everyChar strings.Builder // rule names with every letter and digit
	for _, c := range fillers {
		fmt.Fprintf(&everyChar, "namespace %q { policy = \"read\" }\n", "n"+string(c))
	}
	cases := []struct {
		name     string
		policies []namedPolicy
		listed   []string
		noNode   bool            // Nomad refuses node read
		grants   map[string]bool // Nomad's read-job, by rule name
		all      bool
		reason   []string
	}{
		{name: "README policy", policies: []namedPolicy{{"p", readmePolicy(t)}}, listed: []string{"default", "other"},
			grants: map[string]bool{"*": true}, all: true},
		{name: "policy read", policies: []namedPolicy{{"p", nodeRead + `namespace "*" { policy = "read" }`}},
			grants: map[string]bool{"*": true}, all: true},
		{name: "double-star catch-all", policies: []namedPolicy{{"p", nodeRead + `namespace "**" { capabilities = ["read-job"] }`}},
			grants: map[string]bool{"**": true}, all: true},
		{name: "no policies", noNode: true, reason: []string{"(policies (none)) cannot read the node"}},
		{name: "unparseable policy", policies: []namedPolicy{{"broken", nodeRead + `namespace "*" { capabilities = [`}},
			grants: map[string]bool{"*": true}, reason: []string{`policy "broken" of the Nomad token cannot be parsed`}},
		{name: "namespace block without a name", policies: []namedPolicy{{"nameless", nodeRead + all + `namespace { policy = "deny" }`}},
			grants: map[string]bool{"*": true}, reason: []string{`policy "nameless" of the Nomad token cannot be parsed`}},
		{name: "deny in another policy wins", policies: []namedPolicy{{"p", nodeRead + all}, {"q", `namespace "*" { policy = "deny" }`}},
			grants: map[string]bool{"*": false}, reason: []string{`namespaces matching "*"`, `policy "q" denies it`}},
		{name: "listed namespace denied through a glob", policies: []namedPolicy{{"p", nodeRead + all + `namespace "sec*" { policy = "deny" }`}},
			listed: []string{"default", "secret"}, grants: map[string]bool{"*": true, "sec*": false},
			reason: []string{`namespace "secret" (policy "p" denies it through namespace "sec*")`, `nor in namespaces matching "sec*"`}},
		{name: "glob without read-job", policies: []namedPolicy{{"p", nodeRead + all + `namespace "dev-*" { capabilities = ["list-jobs"] }`}},
			grants: map[string]bool{"*": true, "dev-*": false},
			reason: []string{`namespaces matching "dev-*" (policy "p" grants no read-job there)`}},
		{name: "unlisted literal without read-job", policies: []namedPolicy{{"p", nodeRead + all + `namespace "ops" { capabilities = ["list-jobs"] }`}},
			listed: []string{"default"}, grants: map[string]bool{"*": true, "ops": false},
			reason: []string{`namespace "ops" (policy "p" grants no read-job there)`}},
		{name: "no catch-all", policies: []namedPolicy{{"p", nodeRead + `namespace "default" { policy = "read" }` + "\n" + `namespace "dev*" { policy = "read" }`}},
			grants: map[string]bool{"default": true, "dev*": true},
			reason: []string{`namespaces no rule names (such as "` + probe + `")`, `no namespace "*" rule grants read-job`}},
		{name: "glob that matches the probe is no catch-all", policies: []namedPolicy{{"p", nodeRead + `namespace "zfs*" { policy = "read" }`}},
			grants: map[string]bool{"zfs*": true}, reason: []string{`namespaces no rule names (such as "x")`}},
		{name: "glob shadowed at every probe", policies: []namedPolicy{{"p", nodeRead + all +
			`namespace "a*" { policy = "deny" }` + "\n" + `namespace "a*zfs-visibility-probe-*" { policy = "read" }`}},
			grants: map[string]bool{"*": true, "a*": false, "a*zfs-visibility-probe-*": true},
			reason: []string{`namespaces matching "a*" (policy "p" denies it)`}},
		{name: "glob shadowed where x would be", policies: []namedPolicy{{"p", nodeRead + all +
			`namespace "a*" { policy = "deny" }` + "\n" + `namespace "a*x" { policy = "read" }` + "\n" + `namespace "a*zfs-visibility-probe-*" { policy = "read" }`}},
			grants: map[string]bool{"*": true, "a*": false, "a*x": true, "a*zfs-visibility-probe-*": true},
			reason: []string{`namespaces matching "a*" (policy "p" denies it)`}},
		{name: "JSON policy", policies: []namedPolicy{{"json", `{"node": {"policy": "read"}, "namespace": {"*": {"capabilities": ["read-job"]}, "dev-*": {"policy": "deny"}}}`}},
			grants: map[string]bool{"*": true, "dev-*": false}, reason: []string{`namespaces matching "dev-*" (policy "json" denies it)`}},
		{name: "other blocks", policies: []namedPolicy{{"p", otherBlocksPolicy}}, listed: []string{"default"},
			grants: map[string]bool{"*": true}, all: true},
		{name: "every character in rule names", policies: []namedPolicy{{"p", nodeRead + all + everyChar.String()}},
			grants: map[string]bool{"*": true}, reason: []string{"use every letter and digit"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := evaluate(t, tc.policies, tc.listed, probe, !tc.noNode, tc.grants)
			t.Logf("All=%v Reason: %s", v.All, v.Reason)
			must.EqOp(t, tc.all, v.All)
			for _, s := range tc.reason {
				must.StrContains(t, v.Reason, s)
			}
			if !tc.all {
				must.StrHasSuffix(t, visibilityGrant, v.Reason)
			}
		})
	}
}

// otherBlocksPolicy grants what the README policy grants, among blocks
// CheckVisibility does not read.
const otherBlocksPolicy = `
agent { policy = "read" }
operator { policy = "read" }
quota { policy = "read" }
plugin { policy = "list" }
node { policy = "read" }
node_pool "*" { policy = "read" }
host_volume "*" { policy = "read" }
namespace "*" {
  policy       = "read"
  capabilities = ["alloc-lifecycle"]
  variables {
    path "*" { capabilities = ["read", "list"] }
  }
}
`

func TestVisibility_GlobMatch(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"*", "anything", true},
		{"sec*", "secret", true},
		{"sec*", "asecret", false},
		{"*ret", "secret", true},
		{"s*c*t", "secret", true},
		{"s*x*t", "secret", false},
		{"secret", "secret", true},
		{"secret", "secrets", false},
		{"a*a", "a", false},
	}
	for _, tc := range cases {
		must.EqOp(t, tc.want, globMatch(tc.pattern, tc.name), must.Sprintf("%q ~ %q", tc.pattern, tc.name))
	}
}
