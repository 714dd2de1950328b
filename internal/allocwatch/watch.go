// Package allocwatch reads the allocations of this plugin's node through the
// Nomad HTTP API: it learns the node ID, follows the node's allocations with
// blocking queries (plus a full read at start and on a slow period), and
// answers the two questions the release logic asks: which live allocation
// holds a device, and whether an allocation has positively ended.
//
// Nomad's device API has no release call, so this is how the plugin learns
// that a dataset can be taken back. Every uncertainty (an API error, a
// timeout, a 403, a namespace the token cannot read) is reported as an error
// or as "unknown", never as "ended".
package allocwatch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	cleanhttp "github.com/hashicorp/go-cleanhttp"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-device-zfs/nomad-device-zfs/internal/loop"
)

// Device vendor and type of the plugin's devices in allocations.
const (
	deviceVendor = "zfs"
	deviceType   = "dataset"
)

// Defaults and deadlines. Every call to the API has one.
const (
	DefaultFullPeriod = 5 * time.Minute
	blockingWait      = 5 * time.Minute
	// blockingDeadline bounds a blocking query: its wait, Nomad's jitter
	// (up to wait/16) and a margin for the answer.
	blockingDeadline = blockingWait + blockingWait/16 + 30*time.Second
	// callTimeout bounds every other call.
	callTimeout = 15 * time.Second
	// readGap is how long Run waits, after a read that brought a change,
	// before it asks again. The first change of a burst comes back at once
	// (the blocking query is waiting for it); the changes within the next
	// readGap (a batch of tasks ending, each allocation's several updates)
	// come back together in the next read, instead of one read of the
	// whole list, every allocation's job included, per change. A read that
	// changed who holds the plugin's devices (an allocation placed on one,
	// or ended, or told to stop) is followed by the next at once: the end
	// of a device's holder is followed within some 60 ms by the placement
	// of its next one, which the slot manager prepares for before that
	// allocation's task asks (slots.prepare).
	readGap    = 200 * time.Millisecond
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	maxBehind  = 3
)

// ErrPermission is wrapped by errors that come from a 403: the token may not
// read what was asked. It always means "keep".
var ErrPermission = errors.New("permission denied by the Nomad API")

// Config says how to reach the Nomad API. Empty fields take the standard
// NOMAD_* environment variables, then the local agent.
type Config struct {
	Address       string
	TokenFile     string
	CAFile        string
	CertFile      string
	KeyFile       string
	TLSServerName string
	// NodeID overrides the node ID learned from the local agent.
	NodeID string
	// Token, when set, is the ACL token (the operator CLI's -token); a
	// TokenFile still wins.
	Token string
	// FullPeriod is how often the allocations are read in full besides the
	// blocking queries (DefaultFullPeriod when zero).
	FullPeriod time.Duration
}

// Alloc is what the plugin needs to know of one allocation.
type Alloc struct {
	ID, Namespace, JobID, TaskGroup, Name string
	ClientStatus                          string
	// ParentJobID is the job that launched JobID when it is a periodic
	// or dispatched child; "" otherwise.
	ParentJobID string
	// Previous is the allocation this one replaced (PreviousAllocation:
	// rescheduled, migrated off a drained or lost node, or updated
	// destructively); "" for none.
	Previous string
	// Stopping is true when the servers want the allocation stopped or
	// evicted: a Reserve for its devices then comes from a new allocation.
	Stopping bool
	// Devices maps each of the plugin's device IDs the allocation holds to
	// the task that holds it.
	Devices map[string]string
	// DeadTasks lists tasks whose state is "dead"; StartedTasks those that
	// have started (running, or with a start time).
	DeadTasks, StartedTasks map[string]bool
}

// Ended reports whether the allocation has positively stopped on the client
// for the given task: its client status is complete, or it is failed or
// lost and the task is dead. Desired status alone ("stop") is not enough:
// the task may still be running. Nor is "failed": Nomad reports it as soon
// as one task fails, and the allocation's poststop tasks run after that.
func (a *Alloc) Ended(task string) bool {
	switch a.ClientStatus {
	case api.AllocClientStatusComplete:
		return true
	case api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return a.DeadTasks[task]
	}
	return false
}

// Snapshot is the latest view of the node's allocations.
type Snapshot struct {
	// Allocs holds the allocations the token can see, by ID.
	Allocs map[string]*Alloc
	// Index is the Raft index of the read.
	Index uint64
	// Began is when the request was sent; At is when the answer came. A
	// read is consistent (never a stale follower's), so a snapshot shows the
	// servers' state at some moment after Began.
	Began, At time.Time
}

// Watcher follows one node's allocations. Its methods are safe for
// concurrent use.
type Watcher struct {
	log        hclog.Logger
	client     *api.Client
	cfg        Config
	fullPeriod time.Duration
	// minBackoff and maxBackoff bound the wait after a failed read.
	minBackoff, maxBackoff time.Duration
	// readGap is the wait after a read that brought a change (readGap).
	readGap time.Duration

	// mu guards the fields below.
	mu       sync.Mutex
	nodeID   string
	snap     *Snapshot
	lastErr  error
	tokenMod time.Time
	tokenLen int64
	updated  chan struct{} // closed and replaced on every new snapshot
	// flight is the latest non-blocking read started by Fresh.
	flight *flight
	// vis is what the latest visibility check said; visAt when it ran;
	// visStale is set when the token changed since. visAllSince is when
	// the check began that found the token seeing every namespace, after
	// a check that did not (or none) or a change of the token; zero while
	// it is not known to see them all (VisibleSince).
	vis         Visibility
	visErr      error
	visAt       time.Time
	visStale    bool
	visAllSince time.Time
	// obs is told of failed reads (SetObserver); nil for none.
	obs Observer
}

// flight is one non-blocking read that callers of Fresh share.
type flight struct {
	began time.Time
	done  chan struct{} // closed when snap or err is set
	snap  *Snapshot
	err   error
}

// New returns a watcher; it does not contact Nomad until Run.
func New(cfg Config, log hclog.Logger) (*Watcher, error) {
	ac := api.DefaultConfig()
	if cfg.Address != "" {
		ac.Address = cfg.Address
	}
	if cfg.CAFile != "" {
		ac.TLSConfig.CACert = cfg.CAFile
	}
	if cfg.CertFile != "" {
		ac.TLSConfig.ClientCert = cfg.CertFile
	}
	if cfg.KeyFile != "" {
		ac.TLSConfig.ClientKey = cfg.KeyFile
	}
	if cfg.TLSServerName != "" {
		ac.TLSConfig.TLSServerName = cfg.TLSServerName
	}
	// Blocking queries wait up to blockingWait. Every call also carries a
	// context deadline; the client's own timeout is a backstop.
	ac.WaitTime = blockingWait
	ac.HttpClient = cleanhttp.DefaultPooledClient()
	ac.HttpClient.Timeout = blockingDeadline
	if tr, ok := ac.HttpClient.Transport.(*http.Transport); ok {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		tr.DisableCompression = true // see plainAnswers
	}
	if err := api.ConfigureTLS(ac.HttpClient, ac.TLSConfig); err != nil {
		return nil, fmt.Errorf("nomad API TLS for %s: %w", ac.Address, err)
	}
	ac.HttpClient.Transport = leanAnswers{plainAnswers{ac.HttpClient.Transport}}
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("nomad API client for %s: %w", ac.Address, err)
	}
	w := &Watcher{log: log, client: client, cfg: cfg, fullPeriod: cfg.FullPeriod, nodeID: cfg.NodeID,
		minBackoff: minBackoff, maxBackoff: maxBackoff, readGap: readGap, updated: make(chan struct{})}
	if w.fullPeriod == 0 {
		w.fullPeriod = DefaultFullPeriod
	}
	if cfg.Token != "" {
		client.SetSecretID(cfg.Token)
	}
	if cfg.TokenFile != "" {
		if err := w.refreshToken(); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// plainAnswers asks Nomad for uncompressed answers. The api package asks
// for gzip on every request; the plugin talks to its own node's agent, and
// the node's allocation list, read at the changes of any allocation on
// the node, is mostly the jobs of finished allocations: compressing it on
// the agent and inflating it here cost both more CPU, under churn, than
// every zfs command of the releases (measured in bench/README.md).
type plainAnswers struct{ next http.RoundTripper }

// RoundTrip sends a copy of req without the api package's Accept-Encoding.
func (p plainAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Accept-Encoding") != "" {
		req = req.Clone(req.Context())
		req.Header.Del("Accept-Encoding")
	}
	return p.next.RoundTrip(req)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (p plainAnswers) CloseIdleConnections() {
	if c, ok := p.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Address is the API address in use.
func (w *Watcher) Address() string { return w.client.Address() }

// refreshToken re-reads the token file when its size or modification time
// changed since the last read.
func (w *Watcher) refreshToken() error {
	if w.cfg.TokenFile == "" {
		return nil
	}
	fi, err := os.Stat(w.cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("nomad token_file: %w", err)
	}
	w.mu.Lock()
	same := fi.ModTime().Equal(w.tokenMod) && fi.Size() == w.tokenLen
	w.mu.Unlock()
	if same {
		return nil
	}
	b, err := os.ReadFile(w.cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("nomad token_file: %w", err)
	}
	w.client.SetSecretID(strings.TrimSpace(string(b)))
	w.mu.Lock()
	w.tokenMod, w.tokenLen = fi.ModTime(), fi.Size()
	w.visStale = true
	w.visAllSince = time.Time{}
	w.mu.Unlock()
	w.log.Debug("nomad token read", "token_file", w.cfg.TokenFile)
	return nil
}

// NodeID returns the node ID, asking the local agent the first time: the
// configured node_id, else /v1/agent/self (needs agent:read), else the one
// node whose name is this host's name (needs node:read only).
func (w *Watcher) NodeID(ctx context.Context) (string, error) {
	w.mu.Lock()
	id := w.nodeID
	w.mu.Unlock()
	if id != "" {
		return id, nil
	}
	if err := w.refreshToken(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	q := (&api.QueryOptions{}).WithContext(ctx)
	var self *api.AgentSelf
	_, err := w.client.Raw().Query("/v1/agent/self", &self, q)
	if err == nil && self != nil {
		if s, ok := self.Stats["client"]; ok && s["node_id"] != "" {
			id = s["node_id"]
		}
	}
	if id == "" {
		host, herr := os.Hostname()
		if herr != nil {
			return "", fmt.Errorf("learning the node ID: agent self: %v; hostname: %w", err, herr)
		}
		nodes, _, lerr := w.client.Nodes().List(q)
		if lerr != nil {
			lerr = fmt.Errorf("learning the node ID: agent self: %v; listing nodes: %w", err, classify(lerr))
			w.readFailed(CallNodeID, lerr)
			return "", lerr
		}
		var matches []string
		for _, n := range nodes {
			if n.Name == host {
				matches = append(matches, n.ID)
			}
		}
		if len(matches) != 1 {
			return "", fmt.Errorf("learning the node ID: agent self: %v; %d nodes are named %q: set nomad { node_id = ... }", err, len(matches), host)
		}
		id = matches[0]
	}
	w.mu.Lock()
	w.nodeID = id
	w.mu.Unlock()
	return id, nil
}

// Run follows the node's allocations until ctx is done, calling onUpdate
// (from Run's goroutine) after each successful read that changed the index
// or after a full read; after such a read it waits readGap before the
// next. Errors are logged, kept for Err, and retried with a capped
// backoff; they never clear the last snapshot.
//
// Unlike the plugin's other loops the watch has no period: each pass is a
// Nomad blocking query, which waits in the read until the node's
// allocations change (or the query's wait ends). The driver's timer only
// spaces the reads: at once after an answer that changed who holds the
// devices or changed nothing, readGap after any other change, the backoff
// after a failure.
func (w *Watcher) Run(ctx context.Context, onUpdate func(*Snapshot)) {
	backoff := w.minBackoff
	retry := func() loop.Next {
		next := loop.After(backoff)
		backoff = min(backoff*2, w.maxBackoff)
		return next
	}
	var index, seen uint64 // wait index; highest index taken
	var holding string     // holdingKey of the latest snapshot taken
	behind := 0
	lastFull := time.Time{}
	cfg := loop.Config{Name: "allocation watch", Log: w.log, First: loop.After(0)}
	loop.Run(ctx, cfg, func(ctx context.Context, _ loop.Wake) loop.Next {
		full := time.Since(lastFull) >= w.fullPeriod
		wait := index
		if full {
			wait = 0
		}
		snap, err := w.read(ctx, wait)
		if err != nil {
			if ctx.Err() != nil {
				return loop.Stop(nil)
			}
			w.setErr(err)
			w.log.Warn("reading the node's allocations failed; keeping every dataset", "error", err, "retry_in", backoff)
			return retry()
		}
		if snap.Index < seen && behind < maxBehind {
			// An answer older than what we have (a stale server): keep
			// the newer view and ask again from scratch, as Nomad's
			// documentation advises when an index goes back. After
			// maxBehind such answers in a row the index really went back
			// (a restored cluster), and the answer is taken.
			behind++
			w.log.Debug("allocation list older than the last one; ignored", "index", snap.Index, "have", seen)
			index = 0
			return retry()
		}
		behind = 0
		backoff = w.minBackoff
		if full {
			lastFull = time.Now()
		}
		changed := snap.Index != index || full
		index, seen = snap.Index, snap.Index
		w.setSnapshot(snap)
		if !changed {
			return loop.After(0)
		}
		onUpdate(snap)
		if key := holdingKey(snap); key != holding {
			holding = key
			return loop.After(0)
		}
		return loop.After(w.readGap)
	})
}

// holdingKey sums up who holds the plugin's devices in s: every
// allocation that holds one, with whether it is stopping and, for each
// device, whether its task has ended (Alloc.Ended), in order. Two snapshots with the same key differ only in what the slot
// manager does not act on (task events, other allocations).
func holdingKey(s *Snapshot) string {
	var b strings.Builder
	for _, id := range s.SortedIDs() {
		a := s.Allocs[id]
		if len(a.Devices) == 0 {
			continue
		}
		b.WriteString(id)
		if a.Stopping {
			b.WriteString("!")
		}
		devs := make([]string, 0, len(a.Devices))
		for d, task := range a.Devices {
			if a.Ended(task) {
				task += "/ended"
			}
			devs = append(devs, d+"="+task)
		}
		sort.Strings(devs)
		b.WriteString(strings.Join(devs, ","))
		b.WriteString(";")
	}
	return b.String()
}

func (w *Watcher) setSnapshot(s *Snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.snap != nil && s.Began.Before(w.snap.Began) && s.Index < w.snap.Index {
		return // an older read answered late: keep the newer view
	}
	w.snap, w.lastErr = s, nil
	close(w.updated)
	w.updated = make(chan struct{})
}

func (w *Watcher) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastErr = err
}

// Snapshot returns the latest snapshot (nil before the first read) and the
// error of the latest read (nil when it succeeded).
func (w *Watcher) Snapshot() (*Snapshot, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snap, w.lastErr
}

// Updated returns a channel that is closed at the next new snapshot.
func (w *Watcher) Updated() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.updated
}

// classify wraps a 403 from the API with ErrPermission.
func classify(err error) error {
	var ure api.UnexpectedResponseError
	if errors.As(err, &ure) && ure.StatusCode() == http.StatusForbidden {
		return fmt.Errorf("%w: %v", ErrPermission, err)
	}
	return err
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// SortedIDs returns the snapshot's allocation IDs in order (for logs and
// tests).
func (s *Snapshot) SortedIDs() []string {
	ids := make([]string, 0, len(s.Allocs))
	for id := range s.Allocs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
