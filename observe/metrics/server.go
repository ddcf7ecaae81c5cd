package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/pstrain/pstrain/observe/webconfig"
)

// Paths served by [Server].
const (
	MetricsPath = "/metrics"
	HealthPath  = "/healthz"
)

// Server timeouts.
const (
	// scrapeTimeout bounds the time one /metrics request may take.
	scrapeTimeout = 30 * time.Second
	// shutdownTimeout bounds how long Close waits for in-flight requests
	// before cutting their connections.
	shutdownTimeout = 5 * time.Second
)

// Server is the HTTP endpoint of a pstrain process. It serves exactly two
// paths:
//
//   - GET /metrics: the Prometheus exposition of the gatherer, with
//     content negotiation by promhttp but never compressed: a scrape is
//     ~20 KB, and gzip would cost the process a ~1 MB compressor per
//     scrape (its pool is emptied by every GC), which a parameter server
//     on a memory budget notices. A failing collector does not fail the
//     scrape: the remaining metrics are served and the error is logged.
//   - GET /healthz: 200 with body "ok", or 503 with the text of the error
//     returned by the health function.
//
// Everything else is 404; net/http/pprof and the default ServeMux are never
// used. Create a Server with [NewServer], then call [Server.Start] once and
// [Server.Close] (or cancel Start's context) to stop it.
type Server struct {
	handler http.Handler
	logger  *slog.Logger

	mu      sync.Mutex
	started bool
	srv     *http.Server
	addr    string
	tls     bool        // served over TLS (a web config file with TLS)
	stopCtx func() bool // unregisters the context watcher

	done     chan struct{} // closed when the serve goroutine has exited
	serveErr error         // set before done is closed

	closeOnce sync.Once
	closeErr  error
}

// NewServer returns a Server for the metrics gathered by g (normally the
// *prometheus.Registry from [NewRegistry]) and the health check health. A nil
// health function always reports healthy. Errors gathering metrics are logged
// through logger; a nil logger means slog.Default().
func NewServer(g prometheus.Gatherer, health func() error, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+MetricsPath, promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:           slogPrintln{logger},
		ErrorHandling:      promhttp.ContinueOnError,
		Timeout:            scrapeTimeout,
		DisableCompression: true,
	}))
	mux.HandleFunc("GET "+HealthPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if health != nil {
			if err := health(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, strings.TrimRight(err.Error(), "\n")+"\n")
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return &Server{handler: mux, logger: logger, done: make(chan struct{})}
}

// Handler returns the server's HTTP handler, for mounting it elsewhere or
// testing it without a listener.
func (s *Server) Handler() http.Handler { return s.handler }

// Start listens on addr (host:port; ":0" or "127.0.0.1:0" picks a free port)
// and serves plain HTTP in a background goroutine. A listen failure, such
// as the port being in use, is returned at once and names addr. Cancelling
// ctx has the same effect as calling [Server.Close]. Start (or
// [Server.StartWebConfig]) may be called only once.
func (s *Server) Start(ctx context.Context, addr string) error {
	return s.StartWebConfig(ctx, addr, "")
}

// StartWebConfig is Start with the web configuration file that Prometheus
// exporters share (node_exporter's --web.config.file; "" = plain HTTP, as
// Start): TLS and basic authentication for every path, read again on
// every connection and request by github.com/prometheus/exporter-toolkit,
// so renewed certificates and changed users apply without a restart. An
// invalid file is an error here, before anything is served.
func (s *Server) StartWebConfig(ctx context.Context, addr, webConfigFile string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("metrics: server already started")
	}
	if s.closedLocked() {
		return errors.New("metrics: server already closed")
	}
	var tlsOn bool
	if webConfigFile != "" {
		f, err := webconfig.Read(webConfigFile)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		tlsOn = f.TLS.Enabled()
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: cannot serve metrics on %q: %w", addr, err)
	}
	s.started, s.tls = true, tlsOn
	s.addr = ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	go func() {
		defer close(s.done)
		if err := s.serve(ln, webConfigFile); !errors.Is(err, http.ErrServerClosed) {
			s.serveErr = fmt.Errorf("metrics: serving on %s: %w", s.addr, err)
		}
	}()
	s.stopCtx = context.AfterFunc(ctx, func() { _ = s.Close() })
	return nil
}

// serve serves on ln until the server is closed: plain HTTP, or under
// the web config file.
func (s *Server) serve(ln net.Listener, webConfigFile string) error {
	if webConfigFile == "" {
		return s.srv.Serve(ln)
	}
	return web.Serve(ln, s.srv, &web.FlagConfig{WebConfigFile: &webConfigFile}, s.logger.With("component", "metrics"))
}

// closedLocked reports whether Close ran before Start. s.mu must be held and
// Start must not have succeeded.
func (s *Server) closedLocked() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Addr returns the address the server listens on, with the actual port when
// Start was given port 0. It is "" before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// URL returns the server's base URL ("http://" + Addr(), or "https://" under
// a web config file with TLS), or "" before Start.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addr == "" {
		return ""
	}
	if s.tls {
		return "https://" + s.addr
	}
	return "http://" + s.addr
}

// Done returns a channel that is closed once the server has stopped and its
// goroutine has exited (or at once by Close on a server never started).
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops the server: it stops accepting connections, gives in-flight
// requests a few seconds to finish, and waits for the serve goroutine to exit.
// It returns the error that ended serving, if any other than the shutdown
// itself. Close is safe to call more than once and concurrently; later calls
// return the first call's result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		srv, stopCtx := s.srv, s.stopCtx
		if srv == nil {
			// Never started: there is no goroutine to wait for.
			close(s.done)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if stopCtx != nil {
			stopCtx()
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		<-s.done
		s.closeErr = s.serveErr
	})
	return s.closeErr
}

// slogPrintln adapts a *slog.Logger to promhttp.Logger.
type slogPrintln struct{ l *slog.Logger }

func (p slogPrintln) Println(v ...any) {
	p.l.Error("metrics: serving /metrics", "error", strings.TrimSpace(fmt.Sprintln(v...)))
}
