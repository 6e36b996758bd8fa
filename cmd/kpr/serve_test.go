package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kpr-io/kpr/metrics"
)

// TestBusyPortIsRetried: without --bind-address-hard-fail a metrics server
// whose port another process holds is tried again, and serves once the
// port is free; with it, the first failure is returned, which stops kpr.
func TestBusyPortIsRetried(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := busy.Addr().String()
	serve := func(ctx context.Context) error { return metrics.ListenAndServe(ctx, addr, metricsOK{}) }

	if err := serveRetrying(context.Background(), "metrics", true, time.Millisecond, zap.NewNop(), serve); err == nil {
		t.Fatal("hard fail: a busy port returned no error")
	}

	ctx, cancel := context.WithCancel(context.Background())
	core, logs := observer.New(zap.ErrorLevel)
	done := make(chan error, 1)
	go func() { done <- serveRetrying(ctx, "metrics", false, 20*time.Millisecond, zap.New(core), serve) }()
	deadline := time.Now().Add(10 * time.Second)
	for logs.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if logs.Len() == 0 {
		t.Fatal("no error logged for the busy port")
	}
	select {
	case err := <-done:
		t.Fatalf("without hard fail, a busy port ended the server: %v", err)
	default:
	}
	busy.Close()
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics server never came up once the port was free: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("server returned %v on shutdown", err)
	}
}

type metricsOK struct{}

func (metricsOK) ServeHTTP(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }

func TestBindAddressWithoutPort(t *testing.T) {
	f, _, _, err := parseRun(t, "--healthz-bind-address=0.0.0.0", "--metrics-bind-address=::", "--metrics-port=9999")
	if err != nil {
		t.Fatal(err)
	}
	if f.healthzAddr != "0.0.0.0:10256" || f.metricsAddr != "[::]:9999" {
		t.Errorf("healthz %q metrics %q, want 0.0.0.0:10256 and [::]:9999", f.healthzAddr, f.metricsAddr)
	}
}
