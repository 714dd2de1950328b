package allocwatch

// What CheckVisibility asks Nomad about a client token, and what it
// concludes from the answers: the token's namespace rules (parsed as Nomad
// parses them), the names to ask about, the verdict and its Reason.

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/hashicorp/hcl"
	"github.com/hashicorp/hcl/hcl/ast"
)

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
