package allocwatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/hcl/ast"
	"github.com/hashicorp/nomad/api"
)

// Visibility says whether the plugin's Nomad token sees the allocations of
// every namespace. Nomad silently leaves the allocations of namespaces a
// token cannot read out of the node's allocation list, and answers 404 for
// them as for allocations that are gone, so only Nomad's positive answers
// about the token make those answers evidence.
type Visibility struct {
	// All is true only on positive evidence: ACLs are disabled, the token is
	// a management token, or Nomad let it read the node and the jobs of
	// every namespace name its policies make it necessary to ask about
	// (planVisibility).
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
// read the allocations of every namespace. For a client token, the token's
// policies say which namespace names to ask Nomad about (planVisibility),
// and Nomad's answers decide (askNomad). On return, a nil error means the
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
	plan, refused := planVisibility(self.Name, policies, listed, probeName())
	if plan == nil {
		return refused, nil
	}
	return askNomad(ctx, c, plan)
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

// visibilityParallel bounds how many of CheckVisibility's questions to
// Nomad are under way at once.
const visibilityParallel = 8

// askNomad asks Nomad, with c's token, whether that token may read the node
// and then the jobs of each of plan.names, at most visibilityParallel
// requests at a time, and returns plan's verdict on the answers. Nomad
// checks the token before it looks anything up, so the requests name
// things that do not exist:
//
//   - GET /v1/node/<random UUID>/allocations: Node.GetAllocs (the call
//     behind the plugin's own reads of its node) answers 403 unless the
//     token has node read, and 200 with an empty list for an unknown node.
//   - GET /v1/job/<probe>/allocations?namespace=N: Job.Allocations answers
//     403 unless the token has read-job in N (the capability Node.GetAllocs
//     filters allocations by), and 200 with an empty list for a job or
//     namespace that does not exist.
//
// 200 is "may", 403 "may not"; the verdict rests on nothing else. Any other
// answer makes the whole check that answer, through answer(): a negative
// Visibility for another 4xx, an error for the rest (no answer, a 5xx, ctx
// done). Every request ends by ctx's deadline.
func askNomad(ctx context.Context, c *api.Client, plan *visibilityPlan) (Visibility, error) {
	for _, ns := range plan.names {
		if ns == "" || strings.Contains(ns, "*") {
			// The api package sends no namespace for "" (Nomad then
			// reads the client's own), and Nomad reads "*" as "any
			// namespace" (acl.AllNamespacesSentinel). planVisibility
			// makes neither.
			return Visibility{}, fmt.Errorf("checking read-job: cannot ask Nomad about namespace %q", ns)
		}
	}
	nodeID := probeNodeID()
	q := (&api.QueryOptions{}).WithContext(ctx)
	_, _, err := c.Nodes().Allocations(nodeID, q)
	switch {
	case statusOf(err) == http.StatusForbidden:
		return plan.verdict(false, nil), nil
	case err != nil:
		return answer(err, fmt.Sprintf("asking Nomad whether the token may read the node (GET /v1/node/%s/allocations)", nodeID))
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		readable = make(map[string]bool, len(plan.names))
		failed   error // the first answer that is neither 200 nor 403
		failedNS string
	)
	slots := make(chan struct{}, visibilityParallel)
ask:
	for _, ns := range plan.names {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break ask
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			q := (&api.QueryOptions{Namespace: ns}).WithContext(ctx)
			_, _, err := c.Jobs().Allocations(plan.probe, false, q)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				readable[ns] = true
			case statusOf(err) == http.StatusForbidden:
				readable[ns] = false
			case failed == nil:
				failed, failedNS = err, ns
				cancel() // the check has no verdict: stop asking
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		return answer(failed, fmt.Sprintf("asking Nomad whether the token may read jobs in namespace %q (GET /v1/job/%s/allocations)", failedNS, plan.probe))
	}
	if len(readable) < len(plan.names) {
		return Visibility{}, fmt.Errorf("asking Nomad whether the token may read jobs in %d namespaces: %w", len(plan.names), ctx.Err())
	}
	// Every name has its answer; a name without one would read as "may not".
	return plan.verdict(true, func(ns string) bool { return readable[ns] }), nil
}

// probeName is a namespace name that no policy is likely to name.
func probeName() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "zfs-visibility-probe-" + hex.EncodeToString(b[:])
}

// probeNodeID is a random node ID (a version 4 UUID, as Nomad's are).
func probeNodeID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// namedPolicy is an ACL policy's name and rules (HCL or JSON).
type namedPolicy struct {
	Name  string
	Rules string
}

// policyRules is the part of an ACL policy that CheckVisibility reads: its
// namespace blocks, decoded with the HCL package, version and field tags of
// Nomad's acl.Parse (acl.Policy.Namespaces), so that it finds the blocks
// Nomad finds, in HCL or in JSON. Every other block and key (node, agent,
// host_volume, variables, ...) is left unread.
type policyRules struct {
	Namespaces []*namespaceRule `hcl:"namespace,expand"`
}

// namespaceRule is one namespace block: acl.NamespacePolicy without its
// variables.
type namespaceRule struct {
	Name         string `hcl:",key"`
	Policy       string
	Capabilities []string
}

// validRuleName is Nomad's rule for the name of a namespace block
// (validNamespace in acl/policy.go): a namespace name or a glob.
var validRuleName = regexp.MustCompile("^[a-zA-Z0-9-*]{1,128}$")

// parseNamespaceRules returns the namespace blocks of a policy's rules. It
// fails when the rules are neither HCL nor JSON, or when a block's name is
// missing or not a valid name: Nomad's acl.Parse fails on them too, even
// leniently.
func parseNamespaceRules(rules string) (nss []*namespaceRule, err error) {
	if rules == "" {
		return nil, nil // acl.Parse: no rules, no blocks
	}
	defer func() {
		// HCL1's decoder panics on some input; acl.Parse recovers too.
		if r := recover(); r != nil {
			nss, err = nil, fmt.Errorf("invalid policy: %v", r)
		}
	}()
	var p policyRules
	if err := hcl.Decode(&p, rules); err != nil {
		return nil, err
	}
	// As acl.Parse: the decoder gives a block without a name some other
	// key as its name; the syntax tree says which blocks have none.
	root, err := hcl.Parse(rules)
	if err != nil {
		return nil, err
	}
	list, ok := root.Node.(*ast.ObjectList)
	if !ok {
		return nil, errors.New("the policy is not an object")
	}
	for i, item := range list.Filter("namespace").Items {
		if len(item.Keys) == 0 && i < len(p.Namespaces) && p.Namespaces[i] != nil {
			p.Namespaces[i].Name = ""
		}
	}
	for _, ns := range p.Namespaces {
		if ns == nil || !validRuleName.MatchString(ns.Name) {
			name := ""
			if ns != nil {
				name = ns.Name
			}
			return nil, fmt.Errorf("invalid namespace name %q", name)
		}
	}
	return p.Namespaces, nil
}

// nsRule is one namespace block of one policy.
type nsRule struct {
	policy string
	denies bool // policy = "deny", or the deny capability
}

// denial is one namespace (or set of namespaces) the token cannot read.
type denial struct {
	what, why string
}

// fillers are the characters planVisibility may put in place of a glob's
// stars, in order of preference.
const fillers = "xqzjkwvyubcdfghlmnoprstaei0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"

// visibilityPlan is what CheckVisibility asks Nomad about a client token:
// the namespace names whose answers decide whether it reads every
// namespace, and what its policies say about them (for the Reason only).
type visibilityPlan struct {
	token    string              // the token's name
	policies []string            // the names of its policies
	byName   map[string][]nsRule // the namespace blocks, by the name or glob they name
	rules    []string            // the keys of byName, sorted
	listed   []string            // the namespaces Nomad lists
	probe    string              // a random name no rule is likely to name
	filler   string              // a character no rule name has
	names    []string            // every name to ask Nomad about, each once
}

// planVisibility parses the namespace blocks of a client token's policies
// and lists the namespace names to ask Nomad about: every listed
// namespace, every literal name in the rules, each glob with its stars
// replaced by filler (a character no rule name has, so that Nomad judges
// that name by the glob's own rules alone), each glob with its stars
// replaced by probe, probe, and filler on its own (which only a rule named
// with stars alone matches). When a policy
// cannot be parsed, or no character is left for filler, it returns nil and
// the negative Visibility that says so.
func planVisibility(token string, policies []namedPolicy, listed []string, probe string) (*visibilityPlan, Visibility) {
	p := &visibilityPlan{token: token, byName: map[string][]nsRule{}, listed: listed, probe: probe}
	for _, pol := range policies {
		p.policies = append(p.policies, pol.Name)
		nss, err := parseNamespaceRules(pol.Rules)
		if err != nil {
			return nil, Visibility{Reason: fmt.Sprintf("policy %q of the Nomad token cannot be parsed (%v), %s", pol.Name, err, consequenceUnknown)}
		}
		for _, ns := range nss {
			denies := ns.Policy == "deny"
			for _, c := range ns.Capabilities {
				denies = denies || c == "deny"
			}
			p.byName[ns.Name] = append(p.byName[ns.Name], nsRule{policy: pol.Name, denies: denies})
		}
	}
	globs := false
	for name := range p.byName {
		p.rules = append(p.rules, name)
		globs = globs || strings.Contains(name, "*")
	}
	sort.Strings(p.rules)
	for _, c := range fillers {
		used := false
		for _, name := range p.rules {
			used = used || strings.ContainsRune(name, c)
		}
		if !used {
			p.filler = string(c)
			break
		}
	}
	if p.filler == "" && globs {
		return nil, Visibility{Reason: fmt.Sprintf("the namespace rules of %s (policies %s) use every letter and digit, which leaves no name that Nomad would judge by one glob's rules alone, %s",
			tokenDesc(token), quoteList(p.policies), consequenceUnknown)}
	}

	seen := map[string]bool{}
	add := func(name string) {
		if name != "" && !seen[name] {
			seen[name] = true
			p.names = append(p.names, name)
		}
	}
	for _, ns := range listed {
		add(ns)
	}
	for _, name := range p.rules {
		if !strings.Contains(name, "*") {
			add(name)
			continue
		}
		add(p.alone(name))
		add(p.example(name))
	}
	add(probe)
	add(p.filler)
	return p, Visibility{}
}

// alone is glob with its stars replaced by filler: a name that no literal
// rule names, and that another glob matches only through literal
// characters of glob's own, so with no more of them than glob. Nomad judges
// it by glob's rules, unless another glob ties (has all of glob's literal
// characters and matches it too).
func (p *visibilityPlan) alone(glob string) string {
	return strings.ReplaceAll(glob, "*", p.filler)
}

// example is a name that glob matches, with the probe in it.
func (p *visibilityPlan) example(glob string) string {
	return strings.ReplaceAll(glob, "*", p.probe)
}

// verdict decides from Nomad's answers (node: whether the token may read
// the node; readable: whether it may read the jobs of a namespace) whether
// the token reads the node and the jobs of every namespace. It calls
// readable only for the names of p.names, and only when node is true.
//
// Nomad applies to a namespace the rules that name it exactly, else those
// of the matching glob with the most literal characters, else none. So
// every namespace gets the rules of one literal name, of one glob, or
// nothing, and All is true only when Nomad let the token read jobs in every
// listed namespace (asked by name), every literal name, every glob's own
// name (alone: judged by that glob's rules, as every name the glob decides
// is) and example, and in names no rule names (probe, and filler on its
// own, which only a catch-all rule matches: once Nomad lets the token read
// it, no name is left without rules). The policies only choose the names
// and explain a denial.
func (p *visibilityPlan) verdict(node bool, readable func(ns string) bool) Visibility {
	if !node {
		return Visibility{Reason: fmt.Sprintf("%s (policies %s) cannot read the node, %s", tokenDesc(p.token), quoteList(p.policies), consequenceNoNode)}
	}
	may := make(map[string]bool, len(p.names))
	for _, ns := range p.names {
		may[ns] = readable(ns)
	}

	var denied []denial
	seen := map[string]bool{}
	deny := func(what, why string) {
		if !seen[what] {
			seen[what] = true
			denied = append(denied, denial{what: what, why: why})
		}
	}
	for _, ns := range p.listed {
		if !may[ns] {
			deny(fmt.Sprintf("namespace %q", ns), explain(p.byName, ns))
		}
	}
	for _, name := range p.rules {
		if !strings.Contains(name, "*") {
			if !may[name] {
				deny(fmt.Sprintf("namespace %q", name), explain(p.byName, name))
			}
			continue
		}
		if !may[p.alone(name)] {
			deny(fmt.Sprintf("namespaces matching %q", name), explainRules(p.byName[name], ""))
			continue
		}
		if example := p.example(name); !may[example] {
			deny(fmt.Sprintf("namespace %q", example), explain(p.byName, example))
		}
	}
	for _, ns := range []string{p.probe, p.filler} {
		if ns == "" || may[ns] {
			continue
		}
		why := explain(p.byName, ns)
		if _, ok := coveringGlob(p.byName, ns); !ok {
			why = `no namespace "*" rule grants read-job`
		}
		deny(fmt.Sprintf("namespaces no rule names (such as %q)", ns), why)
		break
	}
	if len(denied) == 0 {
		return Visibility{All: true, Reason: fmt.Sprintf("Nomad lets %s (policies %s) read the node and the jobs of every namespace (asked about %d namespace names)",
			tokenDesc(p.token), quoteList(p.policies), len(p.names))}
	}
	msg := fmt.Sprintf("%s cannot read jobs in %s (%s)", tokenDesc(p.token), denied[0].what, denied[0].why)
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
	best, ok := coveringGlob(byName, ns)
	if !ok {
		return "no rule of its policies covers it"
	}
	return explainRules(byName[best], best)
}

// coveringGlob is the glob of byName that matches ns with the most literal
// characters (the first in order among equals), and whether one matches.
func coveringGlob(byName map[string][]nsRule, ns string) (string, bool) {
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
	return best, bestLen >= 0
}

// explainRules names the policies of rules (all for one namespace name,
// through glob when not empty) and whether one denies.
func explainRules(rules []nsRule, glob string) string {
	var deniers, others []string
	for _, r := range rules {
		if r.denies {
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
// serves only the explanations; verdicts come from Nomad.
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
