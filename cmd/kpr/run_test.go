package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
