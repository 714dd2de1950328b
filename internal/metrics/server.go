package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where the metrics are served.
const Path = "/metrics"

// shutdownGrace bounds how long a stopping server waits for scrapes in
// progress before it closes their connections.
const shutdownGrace = 5 * time.Second

// server is the HTTP server of one Metrics.
type server struct {
	// mu guards the fields below; it is held across a start or a stop
	// (never by anything a scrape or slot work needs).
	mu   sync.Mutex
	addr string        // the configured address served; "" when none
	srv  *http.Server  // nil when not serving
	done chan struct{} // closed when srv's Serve goroutine has returned
}

// ValidateAddress checks a listen address of the form host:port, where
// host may be empty (every interface) and port is a number from 1 to
// 65535.
func ValidateAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port, such as \"127.0.0.1:9715\": %w", err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want a number from 1 to 65535", port)
	}
	return nil
}

// Serve serves the metrics at addr (host:port), or stops serving them when
// addr is "". Serving the address already served changes nothing. For a new
// address it listens there first, so that an address that cannot be
// listened on is an error and leaves the server as it was; then it stops
// the old server. Every server's goroutine ends by Close (or a later Serve
// with another address).
func (m *Metrics) Serve(addr string, log hclog.Logger) error {
	s := &m.server
	s.mu.Lock()
	defer s.mu.Unlock()
	if addr == s.addr && (addr == "" || s.srv != nil) {
		return nil
	}
	var (
		srv  *http.Server
		done chan struct{}
	)
	if addr != "" {
		if err := ValidateAddress(addr); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle(Path, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
			ErrorLog:          hclogPrinter{log},
			ErrorHandling:     promhttp.ContinueOnError,
			Timeout:           30 * time.Second,
			EnableOpenMetrics: true,
		}))
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
		done = make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "address", ln.Addr().String(), "error", err)
			}
		}()
		log.Info("serving metrics", "address", ln.Addr().String(), "path", Path)
	}
	s.stopLocked(log)
	s.addr, s.srv, s.done = addr, srv, done
	return nil
}

// Close stops the server, if any, and returns once its goroutine has
// ended.
func (m *Metrics) Close(log hclog.Logger) {
	s := &m.server
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(log)
	s.addr, s.srv, s.done = "", nil, nil
}

// stopLocked stops the current server, if any: scrapes in progress get
// shutdownGrace to end, then their connections are closed. mu is held.
func (s *server) stopLocked(log hclog.Logger) {
	if s.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	log.Info("metrics server stopped", "address", s.addr)
}

// hclogPrinter lets promhttp log through hclog.
type hclogPrinter struct{ log hclog.Logger }

// Println implements promhttp.Logger.
func (p hclogPrinter) Println(v ...interface{}) {
	p.log.Error("serving metrics", "error", fmt.Sprint(v...))
}
