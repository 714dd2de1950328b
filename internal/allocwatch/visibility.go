package allocwatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

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
	// AllowStale: any server may answer (the token's rights are on every
	// one), so the check does not load the leader.
	q := (&api.QueryOptions{AllowStale: true}).WithContext(ctx)
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
			q := (&api.QueryOptions{Namespace: ns, AllowStale: true}).WithContext(ctx)
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
