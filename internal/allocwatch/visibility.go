package allocwatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/acl"
	"github.com/hashicorp/nomad/api"
)

// Visibility says whether the plugin's Nomad token sees the allocations of
// every namespace. Nomad silently leaves the allocations of namespaces a
// token cannot read out of the node's allocation list, and answers 404 for
// them as for allocations that are gone, so only a positive check of the
// token's policies makes those answers evidence.
type Visibility struct {
	// All is true only on positive evidence: ACLs are disabled, the token is
	// a management token, or its policies grant read-job on every namespace
	// and node read.
	All bool
	// Reason says why, in words an operator can act on.
	Reason string
}

// visibilityTimeout bounds CheckVisibility when ctx has no deadline.
const visibilityTimeout = 30 * time.Second

// aclsDisabledAccessor is the AccessorID of the token that Nomad 1.11
// (whose /v1/acl/token/self is answered by ACL.WhoAmI) returns with 200 for
// any secret when ACLs are disabled (structs.ACLsDisabledToken). Real
// accessors are UUIDs, so no ACL token can have it.
const aclsDisabledAccessor = "acls-disabled"

// Endings of negative Reasons: what follows for the datasets, and what the
// operator should grant (every negative Reason ends with visibilityGrant).
const (
	visibilityGrant    = `grant the token node { policy = "read" } and namespace "*" { capabilities = ["read-job"] } (examples/acl/zfs-plugin.policy.hcl)`
	consequenceHidden  = "allocations there are left out of the node's allocation list, so their datasets are never released or handed over; " + visibilityGrant
	consequenceUnknown = "so the plugin cannot tell whether it sees every allocation, and keeps every dataset whose allocation it does not see; " + visibilityGrant
	consequenceNoNode  = "so the plugin sees no allocation and releases or hands over no dataset; " + visibilityGrant
)

// CheckVisibility asks the Nomad API which token c uses and whether it may
// read the allocations of every namespace. On return, a nil error means the
// Visibility is Nomad's positive or negative answer; an error means no
// answer (transport failure, timeout, a 5xx such as "no leader" or an
// expired token), which the caller treats as "not known to be all". Every
// request ends by ctx's deadline, or within 30 s when ctx has none.
func CheckVisibility(ctx context.Context, c *api.Client) (Visibility, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, visibilityTimeout)
		defer cancel()
	}
	q := func() *api.QueryOptions { return (&api.QueryOptions{}).WithContext(ctx) }

	self, _, err := c.ACLTokens().Self(q())
	switch {
	case err != nil && aclsDisabledAnswer(err):
		return Visibility{All: true, Reason: "ACLs are disabled on the Nomad cluster"}, nil
	case statusOf(err) == http.StatusNotFound:
		// ACL.WhoAmI found an identity without an ACL token: a workload
		// or node identity, whose policies the plugin cannot evaluate.
		return Visibility{Reason: "the Nomad token is not an ACL token (a workload identity?), " + consequenceUnknown}, nil
	case err != nil:
		return answer(err, "reading the Nomad token (/v1/acl/token/self)")
	case self.AccessorID == aclsDisabledAccessor:
		return Visibility{All: true, Reason: "ACLs are disabled on the Nomad cluster"}, nil
	case self.Type == "management":
		return Visibility{All: true, Reason: tokenDesc(self.Name) + " is a management token"}, nil
	case self.Type != "client":
		return Visibility{Reason: fmt.Sprintf("%s has the unknown type %q, %s", tokenDesc(self.Name), self.Type, consequenceUnknown)}, nil
	}

	// The token's policies: its own and those of its roles, each once.
	var names []string
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	for _, p := range self.Policies {
		add(p)
	}
	for _, link := range self.Roles {
		if link == nil {
			continue
		}
		role, _, err := c.ACLRoles().Get(link.ID, q())
		if statusOf(err) == http.StatusNotFound {
			continue // Nomad ignores a linked role that no longer exists.
		}
		if err != nil {
			return answer(err, fmt.Sprintf("reading ACL role %q of the Nomad token", link.Name))
		}
		for _, p := range role.Policies {
			if p != nil {
				add(p.Name)
			}
		}
	}
	var policies []namedPolicy
	for _, name := range names {
		p, _, err := c.ACLPolicies().Info(name, q())
		if statusOf(err) == http.StatusNotFound {
			continue // Nomad ignores a linked policy that does not exist.
		}
		if err != nil {
			return answer(err, fmt.Sprintf("reading ACL policy %q of the Nomad token", name))
		}
		policies = append(policies, namedPolicy{Name: name, Rules: p.Rules})
	}
	nss, _, err := c.Namespaces().List(q())
	if err != nil {
		return answer(err, "listing Nomad namespaces")
	}
	listed := make([]string, 0, len(nss))
	for _, ns := range nss {
		listed = append(listed, ns.Name)
	}
	return evaluate(self.Name, policies, listed, probeName()), nil
}

// aclsDisabledAnswer reports whether err is Nomad's "ACLs are disabled"
// answer to an ACL endpoint: 400 with the body "ACL support disabled"
// (nomad/acl_endpoint.go, aclDisabled). Nomad 1.11 answers
// /v1/acl/token/self with the acls-disabled token instead, but its other
// ACL endpoints (and older agents' token/self) give this. It is the one
// place that reads an answer's text: the status alone does not say why.
func aclsDisabledAnswer(err error) bool {
	var ure api.UnexpectedResponseError
	return errors.As(err, &ure) && ure.StatusCode() == http.StatusBadRequest &&
		strings.TrimSpace(ure.Body()) == "ACL support disabled"
}

// statusOf is the HTTP status of an API error, or 0 when err carries none.
func statusOf(err error) int {
	var ure api.UnexpectedResponseError
	if errors.As(err, &ure) {
		return ure.StatusCode()
	}
	return 0
}

// answer turns a failed request into a negative Visibility when Nomad
// answered with a 4xx (the token may not, or the request is refused), and
// into an error otherwise (no answer, or a server-side failure).
func answer(err error, what string) (Visibility, error) {
	var ure api.UnexpectedResponseError
	if errors.As(err, &ure) && ure.StatusCode() >= 400 && ure.StatusCode() < 500 {
		return Visibility{Reason: fmt.Sprintf("%s: Nomad answered %d %q, %s",
			what, ure.StatusCode(), strings.TrimSpace(ure.Body()), consequenceUnknown)}, nil
	}
	return Visibility{}, fmt.Errorf("%s: %w", what, classify(err))
}

// probeName is a namespace name that no policy is likely to name.
func probeName() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "zfs-visibility-probe-" + hex.EncodeToString(b[:])
}

// namedPolicy is an ACL policy's name and HCL rules.
type namedPolicy struct {
	Name  string
	Rules string
}

// nsRule is one namespace block of one policy.
type nsRule struct {
	policy string
	rule   *acl.NamespacePolicy
}

// denial is one namespace (or set of namespaces) the token cannot read.
type denial struct {
	what, why string
}

// evaluate decides, with Nomad's own ACL parser and evaluator, whether a
// client token with these policies may read the node and the jobs of every
// namespace. Nomad applies to a namespace the rules that name it exactly,
// else those of the matching glob with the most literal characters, else
// none; so every namespace gets the rules of one literal name, of one glob,
// or nothing. evaluate therefore checks every literal name, every glob on
// its own, that a glob matches every name, and also asks the token's whole
// ACL about listed (the namespaces the API lists), probe (a name no rule
// names) and one name per glob. All is true only when every check allows
// read-job.
func evaluate(token string, policies []namedPolicy, listed []string, probe string) Visibility {
	parsed := make([]*acl.Policy, 0, len(policies))
	byName := map[string][]nsRule{}
	for _, p := range policies {
		pp, err := acl.Parse(p.Rules, acl.PolicyParseLenient)
		if err != nil {
			return Visibility{Reason: fmt.Sprintf("policy %q of the Nomad token cannot be parsed (%v), %s", p.Name, err, consequenceUnknown)}
		}
		parsed = append(parsed, pp)
		for _, ns := range pp.Namespaces {
			byName[ns.Name] = append(byName[ns.Name], nsRule{policy: p.Name, rule: ns})
		}
	}
	full, err := acl.NewACL(false, parsed)
	if err != nil {
		return Visibility{Reason: fmt.Sprintf("the policies of the Nomad token do not compile (%v), %s", err, consequenceUnknown)}
	}
	names := make([]string, 0, len(policies))
	for _, p := range policies {
		names = append(names, p.Name)
	}
	if !full.AllowNodeRead() {
		return Visibility{Reason: fmt.Sprintf("%s (policies %s) cannot read the node, %s", tokenDesc(token), quoteList(names), consequenceNoNode)}
	}

	var denied []denial
	seen := map[string]bool{}
	deny := func(what, why string) {
		if !seen[what] {
			seen[what] = true
			denied = append(denied, denial{what: what, why: why})
		}
	}
	readable := func(a *acl.ACL, ns string) bool {
		return a.AllowNamespaceOperation(ns, acl.NamespaceCapabilityReadJob)
	}
	for _, ns := range listed {
		if !readable(full, ns) {
			deny(fmt.Sprintf("namespace %q", ns), explain(byName, ns))
		}
	}
	rules := make([]string, 0, len(byName))
	for name := range byName {
		rules = append(rules, name)
	}
	sort.Strings(rules)
	catchAll := false
	for _, name := range rules {
		if !strings.Contains(name, "*") {
			if !readable(full, name) {
				deny(fmt.Sprintf("namespace %q", name), explain(byName, name))
			}
			continue
		}
		if strings.Trim(name, "*") == "" {
			catchAll = true
		}
		// The glob's own rules, merged across policies as Nomad does.
		own := &acl.Policy{}
		for _, r := range byName[name] {
			own.Namespaces = append(own.Namespaces, r.rule)
		}
		alone, err := acl.NewACL(false, []*acl.Policy{own})
		what := fmt.Sprintf("namespaces matching %q", name)
		if err != nil || !readable(alone, strings.ReplaceAll(name, "*", "x")) {
			deny(what, explainRules(byName[name], ""))
			continue
		}
		if example := strings.ReplaceAll(name, "*", probe); !readable(full, example) {
			deny(fmt.Sprintf("namespace %q", example), explain(byName, example))
		}
	}
	if !catchAll || !readable(full, probe) {
		deny(fmt.Sprintf("namespaces no rule names (such as %q)", probe), `no namespace "*" rule grants read-job`)
	}
	if len(denied) == 0 {
		return Visibility{All: true, Reason: fmt.Sprintf("the policies of %s (%s) grant node read and read-job on every namespace", tokenDesc(token), quoteList(names))}
	}
	msg := fmt.Sprintf("%s cannot read jobs in %s (%s)", tokenDesc(token), denied[0].what, denied[0].why)
	if len(denied) > 1 {
		more := make([]string, 0, len(denied)-1)
		for _, d := range denied[1:] {
			more = append(more, d.what)
		}
		msg += ", nor in " + strings.Join(more, ", ")
	}
	return Visibility{Reason: msg + ": " + consequenceHidden}
}

// explain says which rules decide namespace ns, as Nomad picks them: the
// rules that name it exactly, else those of the matching glob with the most
// literal characters.
func explain(byName map[string][]nsRule, ns string) string {
	if rs, ok := byName[ns]; ok {
		return explainRules(rs, "")
	}
	best, bestLen := "", -1
	for name := range byName {
		if !strings.Contains(name, "*") || !globMatch(name, ns) {
			continue
		}
		n := len(name) - strings.Count(name, "*")
		if n > bestLen || (n == bestLen && name < best) {
			best, bestLen = name, n
		}
	}
	if bestLen < 0 {
		return "no rule of its policies covers it"
	}
	return explainRules(byName[best], best)
}

// explainRules names the policies of rules (all for one namespace name,
// through glob when not empty) and whether one denies.
func explainRules(rules []nsRule, glob string) string {
	var deniers, others []string
	for _, r := range rules {
		isDeny := false
		for _, c := range r.rule.Capabilities {
			if c == acl.NamespaceCapabilityDeny {
				isDeny = true
			}
		}
		if isDeny {
			deniers = append(deniers, r.policy)
		} else {
			others = append(others, r.policy)
		}
	}
	via := ""
	if glob != "" {
		via = fmt.Sprintf(" through namespace %q", glob)
	}
	if len(deniers) > 0 {
		return fmt.Sprintf("policy %s denies it%s", quoteList(deniers), via)
	}
	return fmt.Sprintf("policy %s grants no read-job there%s", quoteList(others), via)
}

// globMatch reports whether name matches pattern, where '*' matches any run
// of characters, as github.com/ryanuber/go-glob (Nomad's matcher) does. It
// serves only explain; verdicts come from the acl package.
func globMatch(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == name
	}
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	name = name[len(parts[0]):]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(name, part)
		if i < 0 {
			return false
		}
		name = name[i+len(part):]
	}
	return strings.HasSuffix(name, parts[len(parts)-1])
}

// tokenDesc names a token by its name, when it has one.
func tokenDesc(name string) string {
	if name == "" {
		return "the Nomad token"
	}
	return fmt.Sprintf("the Nomad token %q", name)
}

// quoteList renders names as "a", "b" (or "(none)").
func quoteList(names []string) string {
	if len(names) == 0 {
		return "(none)"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
