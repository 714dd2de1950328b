package nomadtest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxyDialTimeout bounds the proxy's connection to its target.
const proxyDialTimeout = 10 * time.Second

// proxyMode is what the proxy does with connections.
type proxyMode int

const (
	modePass proxyMode = iota
	modeCut
	modeHang
)

// Counts is what a Proxy has seen since it started. The proxy sees TCP
// connections, not HTTP requests: a client that reuses a keep-alive
// connection makes several requests on one.
type Counts struct {
	// Accepted counts every connection accepted, in any mode.
	Accepted int
	// Forwarded counts connections accepted in Pass mode (connected, or
	// being connected, to the target).
	Forwarded int
	// Refused counts connections accepted in Cut mode and closed at once.
	Refused int
	// Hung counts connections accepted in Hang mode (never answered).
	Hung int
	// Open is how many connections are open now, forwarding or held.
	Open int
	// GaveUp counts connections that their client closed while the proxy was
	// hung: a client that timed out. It is seen only while the proxy reads
	// from the client (always for connections accepted in Hang mode; for a
	// connection hung mid-way, only when it held no unforwarded request).
	GaveUp int
}

// Proxy is a TCP proxy in front of a target address that a test can cut or
// hang at any time, to show a client a dead or an unresponsive API. All its
// methods are safe for concurrent use.
type Proxy struct {
	// Addr is the proxy's address as an HTTP URL (http://127.0.0.1:port),
	// usable as a Nomad address; HostPort is the same as 127.0.0.1:port.
	Addr     string
	HostPort string
	ln       net.Listener
	ctx      context.Context // cancelled by close: ends dials
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	target  string     // host:port that new connections are forwarded to
	mode    proxyMode
	changed chan struct{} // closed (and replaced) on every mode change
	conns   map[*proxyConn]struct{}
	counts  Counts
	closed  bool
}

// StartProxy starts a proxy on a free loopback port in front of target, a
// host:port or a URL such as Agent.Addr, in Pass mode. When the test ends
// it stops: on return of the cleanup the listener and every connection are
// closed and every goroutine of the proxy has ended.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	hostPort, err := proxyTarget(target)
	if err != nil {
		t.Fatalf("proxy target: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		HostPort: ln.Addr().String(),
		target:   hostPort,
		ln:       ln,
		ctx:      ctx,
		cancel:   cancel,
		changed:  make(chan struct{}),
		conns:    make(map[*proxyConn]struct{}),
	}
	p.Addr = "http://" + p.HostPort
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

// SetTarget points new connections at target (a host:port or URL);
// connections already forwarded go on to the old one. A test that must
// write a proxy's address into an agent's configuration before the agent
// has a port starts the proxy in front of a placeholder and sets the
// agent's address once it runs.
func (p *Proxy) SetTarget(target string) error {
	hostPort, err := proxyTarget(target)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.target = hostPort
	p.mu.Unlock()
	return nil
}

// Target returns the host:port new connections are forwarded to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// proxyTarget returns the host:port of a host:port or URL target.
func proxyTarget(target string) (string, error) {
	if !strings.Contains(target, "://") {
		if _, _, err := net.SplitHostPort(target); err != nil {
			return "", err
		}
		return target, nil
	}
	u, err := url.Parse(target)
	if err != nil {
		return "", err
	}
	if u.Hostname() == "" {
		return "", errors.New("no host in " + target)
	}
	port := u.Port()
	switch {
	case port != "":
	case u.Scheme == "http":
		port = "80"
	case u.Scheme == "https":
		port = "443"
	default:
		return "", errors.New("no port in " + target)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// Pass forwards bytes both ways on new connections. Connections held by
// Hang are not resumed: on return they are closed (with a reset), so that
// clients retry on fresh connections instead of receiving a stale answer
// at an arbitrary later time. Outside Hang, open connections go on.
func (p *Proxy) Pass() { p.setMode(modePass) }

// Cut closes every open connection with a reset; on return none is open.
// From then on, until another mode is set, every new connection is accepted
// and closed at once, so a client fails fast.
func (p *Proxy) Cut() { p.setMode(modeCut) }

// Hang makes the proxy an API that never answers: new connections are
// accepted and neither answered nor closed, and open connections stop
// forwarding in both directions (bytes read are held, not delivered) without
// being closed. Connections are held until Pass, Cut, or the test's end,
// which close them.
func (p *Proxy) Hang() { p.setMode(modeHang) }

// Counts returns what the proxy has seen so far.
func (p *Proxy) Counts() Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counts
	c.Open = len(p.conns)
	return c
}

func (p *Proxy) setMode(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.mode
	p.mode = m
	// Close before waking the copies waiting in gate, so that none of them
	// forwards what it held.
	if m == modeCut || (old == modeHang && m != modeHang) {
		for c := range p.conns {
			delete(p.conns, c)
			c.close()
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// close stops the proxy; on return everything it started has ended.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	drop := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		drop = append(drop, c)
		delete(p.conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	for _, c := range drop {
		c.close()
	}
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		c := &proxyConn{client: conn, done: make(chan struct{})}
		// Deciding and registering under one lock: a mode change either
		// sees this connection or this connection sees the new mode.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		p.counts.Accepted++
		mode := p.mode
		switch mode {
		case modeCut:
			p.counts.Refused++
		case modeHang:
			p.counts.Hung++
			p.conns[c] = struct{}{}
		default:
			p.counts.Forwarded++
			p.conns[c] = struct{}{}
		}
		p.mu.Unlock()

		switch mode {
		case modeCut:
			c.close()
		case modeHang:
			p.wg.Add(1)
			go p.hold(c)
		default:
			p.wg.Add(1)
			go p.forward(c)
		}
	}
}

// hold reads and discards what the client of a connection accepted in Hang
// mode sends, only to notice when it gives up.
func (p *Proxy) hold(c *proxyConn) {
	defer p.wg.Done()
	_, _ = io.Copy(io.Discard, c.client)
	p.clientGone(c)
}

// clientGone records that the client closed c, unless the proxy did.
func (p *Proxy) clientGone(c *proxyConn) {
	p.mu.Lock()
	_, open := p.conns[c]
	if open {
		delete(p.conns, c)
		if p.mode == modeHang {
			p.counts.GaveUp++
		}
	}
	p.mu.Unlock()
	c.close()
}

// forward connects c to the target and copies both ways until both
// directions end or c is closed.
func (p *Proxy) forward(c *proxyConn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: proxyDialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.Target())
	if err != nil {
		p.drop(c, true)
		return
	}
	if !c.setServer(server) {
		return // closed by a mode change meanwhile
	}
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.copy(c, server, c.client, true) }()
	go func() { defer both.Done(); p.copy(c, c.client, server, false) }()
	both.Wait()
	p.drop(c, false)
}

// copy copies src to dst, waiting while the proxy hangs. At the end of src
// it half-closes dst; on any other error it closes the whole connection.
func (p *Proxy) copy(c *proxyConn, dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(c) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				c.close()
				return
			}
		}
		if err == nil {
			continue
		}
		if fromClient && p.hung() {
			p.clientGone(c) // nothing is forwarded, not even the end
			return
		}
		if errors.Is(err, io.EOF) {
			if !p.gate(c) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok && tc.CloseWrite() == nil {
				return
			}
		}
		c.close()
		return
	}
}

// gate returns true when the proxy passes bytes, waiting while it hangs,
// and false when c is closed meanwhile.
func (p *Proxy) gate(c *proxyConn) bool {
	for {
		p.mu.Lock()
		mode, changed := p.mode, p.changed
		p.mu.Unlock()
		select {
		case <-c.done:
			return false
		default:
		}
		if mode != modeHang {
			return true
		}
		select {
		case <-changed:
		case <-c.done:
			return false
		}
	}
}

func (p *Proxy) hung() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode == modeHang
}

// drop unregisters and closes c.
func (p *Proxy) drop(c *proxyConn, reset bool) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.closeWith(reset)
}

// proxyConn is a client connection and, once dialed, its target connection.
type proxyConn struct {
	client net.Conn
	done   chan struct{} // closed by close

	mu     sync.Mutex
	server net.Conn
	closed bool
}

// setServer attaches the target connection; when c is already closed it
// closes server and returns false.
func (c *proxyConn) setServer(server net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = server.Close()
		return false
	}
	c.server = server
	return true
}

// close closes both sides with a reset (SO_LINGER 0), so that a peer sees
// the connection fail at once rather than a clean end. It is idempotent.
func (c *proxyConn) close() { c.closeWith(true) }

// closeWith closes both sides, with a reset when reset is true. Without, the
// kernel still delivers bytes already written. It is idempotent.
func (c *proxyConn) closeWith(reset bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	close(c.done)
	for _, conn := range []net.Conn{c.client, c.server} {
		if conn == nil {
			continue
		}
		if tc, ok := conn.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}
}
