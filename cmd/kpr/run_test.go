package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/metrics"
)

func TestProfilingAddsPprofAndKeepsMetrics(t *testing.T) {
	h := withProfiling(metrics.New().Handler("ebpf"))
	for path, want := range map[string]string{
		"/debug/pprof/":             "goroutine",
		"/debug/pprof/heap?debug=1": "runtime.MemStats",
		"/proxyMode":                "ebpf",
		"/metrics":                  "kubeproxy_",
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d, body without %q:\n%.300s", path, rec.Code, want, rec.Body.String())
		}
	}
}

func TestWatcherConfigParsesAddressFlags(t *testing.T) {
	f := &runFlags{hostnameOverride: "Node-A", syncPeriod: time.Second,
		nodePortAddresses: []string{"primary", "localhost"}, externalIPs: "node-local"}
	cfg, err := f.watcherConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "node-a" || cfg.ExternalIPs != desired.ExternalIPsNodeLocal {
		t.Errorf("config = %+v", cfg)
	}
	for _, bad := range []runFlags{
		{nodePortAddresses: []string{"primary", "10.0.0.1"}},
		{externalIPs: "local"},
	} {
		bad.hostnameOverride, bad.syncPeriod = "node-a", time.Second
		if bad.externalIPs == "" {
			bad.externalIPs = "all"
		}
		if _, err := bad.watcherConfig(); err == nil || !strings.Contains(err.Error(), "--") {
			t.Errorf("watcherConfig(%+v) = %v, want an error naming the flag", bad, err)
		}
	}
}
