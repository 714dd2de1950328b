package allocwatch

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/nomadtest"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testenv"
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

// TestVisibility_Evaluate checks the policy evaluation on cases a real
// agent would also accept but that are tedious to set up there: globs that
// tie or shadow, a glob that only looks like a catch-all, merged policies.
func TestVisibility_Evaluate(t *testing.T) {
	const (
		nodeRead = "node {\n  policy = \"read\"\n}\n"
		all      = `namespace "*" { capabilities = ["read-job"] }` + "\n"
		probe    = "zfs-visibility-probe-0123456789ab"
	)
	cases := []struct {
		name     string
		policies []namedPolicy
		listed   []string
		all      bool
		reason   []string
	}{
		{name: "README policy", policies: []namedPolicy{{"p", readmePolicy(t)}}, listed: []string{"default", "other"}, all: true},
		{name: "policy read", policies: []namedPolicy{{"p", nodeRead + `namespace "*" { policy = "read" }`}}, all: true},
		{name: "double-star catch-all", policies: []namedPolicy{{"p", nodeRead + `namespace "**" { capabilities = ["read-job"] }`}}, all: true},
		{name: "no policies", reason: []string{"(policies (none)) cannot read the node"}},
		{name: "unparseable policy", policies: []namedPolicy{{"broken", nodeRead + `namespace "*" { capabilities = [`}},
			reason: []string{`policy "broken" of the Nomad token cannot be parsed`}},
		{name: "deny in another policy wins", policies: []namedPolicy{{"p", nodeRead + all}, {"q", `namespace "*" { policy = "deny" }`}},
			reason: []string{`namespaces matching "*"`, `policy "q" denies it`}},
		{name: "listed namespace denied through a glob", policies: []namedPolicy{{"p", nodeRead + all + `namespace "sec*" { policy = "deny" }`}},
			listed: []string{"default", "secret"},
			reason: []string{`namespace "secret" (policy "p" denies it through namespace "sec*")`, `nor in namespaces matching "sec*"`}},
		{name: "glob without read-job", policies: []namedPolicy{{"p", nodeRead + all + `namespace "dev-*" { capabilities = ["list-jobs"] }`}},
			reason: []string{`namespaces matching "dev-*" (policy "p" grants no read-job there)`}},
		{name: "no catch-all", policies: []namedPolicy{{"p", nodeRead + `namespace "default" { policy = "read" }` + "\n" + `namespace "dev*" { policy = "read" }`}},
			reason: []string{`namespaces no rule names (such as "` + probe + `")`}},
		{name: "glob that matches the probe is no catch-all", policies: []namedPolicy{{"p", nodeRead + `namespace "zfs*" { policy = "read" }`}},
			reason: []string{"namespaces no rule names"}},
		{name: "glob shadowed at every probe", policies: []namedPolicy{{"p", nodeRead + all +
			`namespace "a*" { policy = "deny" }` + "\n" + `namespace "a*zfs-visibility-probe-*" { policy = "read" }`}},
			reason: []string{`namespaces matching "a*"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := evaluate("zfs", tc.policies, tc.listed, probe)
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
