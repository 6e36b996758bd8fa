package main

import (
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
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

// currentGCPercent reads the collector's setting without writing it (a
// read by SetGCPercent would race with the code under test).
func currentGCPercent() int {
	s := []runtimemetrics.Sample{{Name: "/gc/gogc:percent"}}
	runtimemetrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestStartupGCCollectsMoreOnlyDuringTheFirstSync: from the caches' sync
// to the first full reconcile's end the collector runs at
// firstSyncGCPercent, before and after at gcPercent; with GOGC set
// (tune false) the setting is left alone.
func TestStartupGCCollectsMoreOnlyDuringTheFirstSync(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(gcPercent))
	waitFor := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for currentGCPercent() != want {
			if time.Now().After(deadline) {
				t.Fatalf("GC percent is %d, want %d", currentGCPercent(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	synced, first := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { tuneStartupGC(t.Context(), synced, first, true); close(done) }()
	time.Sleep(10 * time.Millisecond)
	if p := currentGCPercent(); p != gcPercent {
		t.Fatalf("before the caches synced: GC percent %d, want %d", p, gcPercent)
	}
	close(synced)
	waitFor(firstSyncGCPercent)
	close(first)
	<-done
	if p := currentGCPercent(); p != gcPercent {
		t.Fatalf("after the first sync: GC percent %d, want %d", p, gcPercent)
	}

	debug.SetGCPercent(77) // as GOGC=77 would
	synced, first = make(chan struct{}), make(chan struct{})
	close(synced)
	close(first)
	tuneStartupGC(t.Context(), synced, first, false)
	if p := currentGCPercent(); p != 77 {
		t.Fatalf("with GOGC set: GC percent %d, want it left at 77", p)
	}
}
