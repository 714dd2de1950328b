package nomadtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// clientTimeout is the http.Client timeout the proxy tests measure against.
const clientTimeout = 2 * time.Second

// okServer is an HTTP server that answers "ok" and counts requests.
type okServer struct {
	*httptest.Server
	requests atomic.Int64
}

func newOKServer(t *testing.T) *okServer {
	t.Helper()
	s := &okServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

// newClient returns a client with its own transport (closed at the end).
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: clientTimeout}
}

// get requests url and returns the body, how long it took and the error.
func get(c *http.Client, url string) (string, time.Duration, error) {
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		return "", time.Since(start), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), time.Since(start), err
}

func TestProxyTarget(t *testing.T) {
	cases := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "127.0.0.1:4646", want: "127.0.0.1:4646"},
		{in: "http://127.0.0.1:4646", want: "127.0.0.1:4646"},
		{in: "http://127.0.0.1:4646/v1/", want: "127.0.0.1:4646"},
		{in: "http://localhost", want: "localhost:80"},
		{in: "https://[::1]", want: "[::1]:443"},
		{in: "localhost", wantErr: true},
		{in: "ftp://host", wantErr: true},
		{in: "http://:4646", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := proxyTarget(tc.in)
			if tc.wantErr {
				must.Error(t, err)
				return
			}
			must.NoError(t, err)
			must.EqOp(t, tc.want, got)
		})
	}
}

// TestProxyModes walks one client through Pass, Cut, Hang (on a new and on
// a kept-alive connection) and Pass again, in that order.
func TestProxyModes(t *testing.T) {
	srv := newOKServer(t)
	p := StartProxy(t, srv.URL)
	c := newClient(t)

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"pass forwards", func(t *testing.T) {
			body, _, err := get(c, p.Addr)
			must.NoError(t, err)
			must.EqOp(t, "ok", body)
			must.EqOp(t, 1, srv.requests.Load())
			must.EqOp(t, 1, p.Counts().Forwarded)
		}},
		{"cut fails fast", func(t *testing.T) {
			p.Cut()
			must.EqOp(t, 0, p.Counts().Open, must.Sprint("Cut closes the kept-alive connection"))
			_, took, err := get(c, p.Addr)
			must.Error(t, err)
			must.Less(t, clientTimeout/4, took, must.Sprintf("took %s", took))
			must.Positive(t, p.Counts().Refused)
			must.EqOp(t, 1, srv.requests.Load())
		}},
		{"hang times out on a new connection", func(t *testing.T) {
			p.Hang()
			before := p.Counts()
			type result struct {
				err  error
				took time.Duration
			}
			done := make(chan result, 1)
			go func() {
				_, took, err := get(c, p.Addr)
				done <- result{err, took}
			}()
			// While the client waits, the proxy holds its connection.
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
				n := p.Counts()
				return n.Hung == before.Hung+1 && n.Open == 1
			}), wait.Timeout(clientTimeout/2), wait.Gap(10*time.Millisecond)))
			r := <-done
			must.Error(t, r.err)
			must.GreaterEq(t, clientTimeout, r.took)
			must.EqOp(t, 1, srv.requests.Load(), must.Sprint("nothing reached the server"))
			// The client, not the proxy, closed it: the proxy saw it give up.
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
				n := p.Counts()
				return n.GaveUp == before.GaveUp+1 && n.Open == 0
			}), wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
		}},
		{"hang stops a kept-alive connection", func(t *testing.T) {
			p.Pass()
			_, _, err := get(c, p.Addr)
			must.NoError(t, err)
			must.EqOp(t, 2, srv.requests.Load())
			accepted := p.Counts().Accepted

			p.Hang()
			_, took, err := get(c, p.Addr)
			must.Error(t, err)
			must.GreaterEq(t, clientTimeout, took)
			must.EqOp(t, accepted, p.Counts().Accepted, must.Sprint("the request reused the open connection"))
			must.EqOp(t, 2, srv.requests.Load(), must.Sprint("the held request was not forwarded"))
		}},
		{"pass again releases held connections and works", func(t *testing.T) {
			// A held connection, accepted while hung.
			hung := p.Counts().Hung
			other := newClient(t)
			held := make(chan error, 1)
			go func() { _, _, err := get(other, p.Addr); held <- err }()
			must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return p.Counts().Hung == hung+1 }),
				wait.Timeout(clientTimeout/2), wait.Gap(10*time.Millisecond)))

			p.Pass()
			must.EqOp(t, 0, p.Counts().Open, must.Sprint("Pass closes held connections"))
			select {
			case err := <-held:
				must.Error(t, err, must.Sprint("the held client sees its connection closed"))
			case <-time.After(clientTimeout / 2):
				t.Fatal("the held client was not released by Pass")
			}
			body, _, err := get(c, p.Addr)
			must.NoError(t, err)
			must.EqOp(t, "ok", body)
			// 3, not 4: the request held since the previous step was
			// dropped, not delivered late.
			must.EqOp(t, 3, srv.requests.Load())
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return // later steps depend on earlier ones
		}
	}
}

// TestProxyConcurrentModes switches modes while clients make requests (run
// it with -race); afterwards Pass works.
func TestProxyConcurrentModes(t *testing.T) {
	srv := newOKServer(t)
	p := StartProxy(t, srv.URL)
	c := &http.Client{Transport: &http.Transport{}, Timeout: 200 * time.Millisecond}
	t.Cleanup(c.CloseIdleConnections)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, _ = get(c, p.Addr)
				_ = p.Counts()
			}
		}()
	}
	modes := []func(){p.Pass, p.Cut, p.Hang, p.Pass, p.Hang, p.Cut}
	for i := 0; i < 60; i++ {
		modes[i%len(modes)]()
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	p.Pass()
	body, _, err := get(newClient(t), p.Addr)
	must.NoError(t, err)
	must.EqOp(t, "ok", body)
	must.Positive(t, p.Counts().Accepted)
}

// TestProxyCleanupNoLeak leaves connections forwarding and held at the end
// of a test and checks that the cleanup ends every goroutine.
func TestProxyCleanupNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("use", func(t *testing.T) {
		srv := newOKServer(t)
		p := StartProxy(t, srv.URL)
		c := newClient(t)
		c.Timeout = 30 * time.Second // still waiting when the test ends

		_, _, err := get(c, p.Addr) // leaves a kept-alive connection
		must.NoError(t, err)
		p.Hang()
		for i := 0; i < 3; i++ {
			go func() { _, _, _ = get(c, p.Addr) }()
		}
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return p.Counts().Open == 3 }),
			wait.Timeout(5*time.Second), wait.Gap(10*time.Millisecond)))
	})
	var now int
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		now = runtime.NumGoroutine()
		return now <= before
	}), wait.Timeout(5*time.Second), wait.Gap(20*time.Millisecond)),
		must.Func(func() string {
			buf := make([]byte, 1<<20)
			return string(buf[:runtime.Stack(buf, true)])
		}))
	t.Logf("goroutines: %d before, %d after", before, now)
}

// TestProxySetTarget: a proxy started before its target exists refuses,
// and forwards once the target is set.
func TestProxySetTarget(t *testing.T) {
	p := StartProxy(t, "127.0.0.1:1") // nothing listens on port 1
	c := newClient(t)
	_, _, err := get(c, p.Addr)
	must.Error(t, err)

	srv := newOKServer(t)
	must.NoError(t, p.SetTarget(srv.URL))
	must.EqOp(t, srv.Listener.Addr().String(), p.Target())
	body, _, err := get(c, p.Addr)
	must.NoError(t, err)
	must.EqOp(t, "ok", body)
	must.Error(t, p.SetTarget("no-port"))
}
