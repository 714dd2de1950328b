package allocs

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/allocwatch"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/nomadtest"
	"github.com/nomad-device-zfs/nomad-device-zfs/internal/testkit/testenv"
)

// TestNomadAllocs_ViewCompleteOnlyFromAReadAfterTheTokenSawAll (red team):
// a read of the node's allocations made while the token could not see
// every namespace stays incomplete after the token is widened (here the
// token file replaced), even though the visibility check that follows it
// now passes: the read may have missed the allocations of the namespaces
// the token could not read then. A View that may use that read reads anew
// instead, as Latest does, so a complete view (the proof of a sole holder)
// only ever comes from a read that began after the token was known to see
// every namespace.
func TestNomadAllocs_ViewCompleteOnlyFromAReadAfterTheTokenSawAll(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	a := nomadtest.StartAgent(t, nomadtest.Options{ACL: true})
	const nodeRead = "node {\n  policy = \"read\"\n}\n"
	for name, rules := range map[string]string{
		"default-only": nodeRead + `namespace "default" { capabilities = ["read-job"] }`,
		"all":          nodeRead + `namespace "*" { capabilities = ["read-job"] }`,
	} {
		_, err := a.API.ACLPolicies().Upsert(&api.ACLPolicy{Name: name, Rules: rules}, nil)
		must.NoError(t, err)
	}
	_, err := a.API.Namespaces().Register(&api.Namespace{Name: "other"}, nil)
	must.NoError(t, err)
	token := func(policy string) string {
		out, _, err := a.API.ACLTokens().Create(&api.ACLToken{Name: policy, Type: "client", Policies: []string{policy}}, nil)
		must.NoError(t, err)
		return out.SecretID
	}
	file := filepath.Join(t.TempDir(), "token")
	must.NoError(t, os.WriteFile(file, []byte(token("default-only")+"\n"), 0o600))
	w, err := allocwatch.New(allocwatch.Config{Address: a.Addr, TokenFile: file, NodeID: a.NodeID}, hclog.NewNullLogger())
	must.NoError(t, err)
	n := nomadAllocs{w}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	since := time.Now()
	narrow, err := n.View(ctx, since)
	must.NoError(t, err)
	must.False(t, narrow.Complete, must.Sprint("the narrow token does not see namespace other"))

	// The token is widened; a View that may use the read made before
	// (it began after since) must not call that read complete.
	must.NoError(t, os.WriteFile(file, []byte(token("all")+"\n"), 0o600))
	// The watcher sees a new token file by its size and time: the same
	// size here, so a time apart from the first file's.
	later := time.Now().Add(2 * time.Second)
	must.NoError(t, os.Chtimes(file, later, later))
	wide, err := n.View(ctx, since)
	must.NoError(t, err)
	visible := w.VisibleSince()
	must.False(t, visible.IsZero(), must.Sprint("the wide token is known to see every namespace"))
	must.True(t, wide.Began.After(visible), must.Sprintf(
		"a view from a read that began at %s, before the token was known to see all at %s (the narrow read began at %s)",
		wide.Began.Format(time.RFC3339Nano), visible.Format(time.RFC3339Nano), narrow.Began.Format(time.RFC3339Nano)))
	must.True(t, wide.Complete, must.Sprint("read anew, after the widened token was known to see all: ", wide.Incomplete))
	again, err := n.View(ctx, since)
	must.NoError(t, err)
	must.True(t, again.Complete, must.Sprint("a read after the widening is complete: ", again.Incomplete))
}

// TestNomadAllocs_AFailedTokenCheckIsRetriedAfterARead (found by CI on the
// OpenZFS VM): the plugin's first check of the token failed ("no cluster
// leader" while the agent started) and a job's Reserve came within the
// 2 s before that check was due again. Its read of the node's allocations
// succeeded, but the cached failure left the view incomplete, so the
// owner of a fresh dataset was never identified and its data was
// released without one. A read that succeeds after a failed check is proof
// that the API answers again: the next View checks the token at once and
// is complete. The real agent answers everything; a small HTTP proxy in
// front of it fails the first /v1/acl/token/self as an agent without a
// leader does, a fault the real agent cannot be made to show on cue.
func TestNomadAllocs_AFailedTokenCheckIsRetriedAfterARead(t *testing.T) {
	testenv.SkipShort(t, "starts a Nomad agent")
	a := nomadtest.StartAgent(t, nomadtest.Options{})
	target, err := url.Parse(a.Addr)
	must.NoError(t, err)
	var checks, failed atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/acl/token/self" && checks.Add(1) == 1 {
			failed.Add(1)
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	w, err := allocwatch.New(allocwatch.Config{Address: srv.URL, NodeID: a.NodeID}, hclog.NewNullLogger())
	must.NoError(t, err)
	n := nomadAllocs{w}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first, err := n.View(ctx, time.Now())
	must.NoError(t, err)
	must.EqOp(t, int32(1), failed.Load(), must.Sprint("the first token check was answered 500"))
	must.False(t, first.Complete, must.Sprint("no visibility known after a failed check"))
	checkedAt := time.Now()

	second, err := n.View(ctx, time.Now())
	must.NoError(t, err)
	took := time.Since(checkedAt)
	t.Logf("second view %s after the failed check: complete=%v %s", took, second.Complete, second.Incomplete)
	// Past the retry period any build checks again: the case proves
	// nothing then (a machine stalled for seconds).
	must.Less(t, 2*time.Second, took, must.Sprint("the second view came too late to tell"))
	must.True(t, second.Complete, must.Sprint("a read succeeded after the failed check, so the token is checked again at once: ", second.Incomplete))
	must.Greater(t, int32(1), checks.Load(), must.Sprint("the token was checked again"))
}
