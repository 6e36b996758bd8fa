package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultBindAddress is kube-proxy's default --metrics-bind-address.
const DefaultBindAddress = "127.0.0.1:10249"

// Handler serves kube-proxy's metrics endpoints:
//
//	/metrics    the registry in Prometheus text format
//	/proxyMode  the proxy mode name as plain text (kpr answers e.g. "ebpf")
//	/healthz    "ok" while the process serves HTTP at all
func (m *Metrics) Handler(proxyMode string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, proxyMode)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok")
	})
	return mux
}

// ListenAndServe serves handler on addr until ctx is done, then shuts the
// server down gracefully. It returns at once if addr cannot be bound, so a
// caller learns about a busy port instead of running without endpoints.
// Both the metrics and the health endpoints are served through it.
func ListenAndServe(ctx context.Context, addr string, handler http.Handler) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another kube-proxy or kpr running? pick a free address)", addr, err)
	}
	return Serve(ctx, lis, handler)
}

// Serve is ListenAndServe on an existing listener (tests pass ":0" listeners
// and read the port back). The listener is closed on return.
func Serve(ctx context.Context, lis net.Listener, handler http.Handler) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()

	select {
	case err := <-done:
		return fmt.Errorf("serve HTTP on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down HTTP server on %s: %w", lis.Addr(), err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve HTTP on %s: %w", lis.Addr(), err)
	}
	return nil
}
