package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// kube-proxy's metric names; dashboards depend on them verbatim.
var kubeProxyNames = []string{
	"kubeproxy_sync_proxy_rules_duration_seconds",
	"kubeproxy_sync_full_proxy_rules_duration_seconds",
	"kubeproxy_sync_partial_proxy_rules_duration_seconds",
	"kubeproxy_network_programming_duration_seconds",
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
	"kubeproxy_sync_proxy_rules_endpoint_changes_total",
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending",
	"kubeproxy_sync_proxy_rules_service_changes_total",
	"kubeproxy_sync_proxy_rules_service_changes_pending",
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
	"kubeproxy_proxy_healthz_total",
	"kubeproxy_proxy_livez_total",
	"kubernetes_build_info",
	"rest_client_requests_total",
	"rest_client_request_duration_seconds",
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestScrapeHasKubeProxyNames(t *testing.T) {
	m := New()
	// Vectors only appear in a scrape once a child exists.
	m.HealthzTotal.WithLabelValues("200").Inc()
	m.LivezTotal.WithLabelValues("503").Inc()
	m.ObserveSync(true, 3*time.Millisecond)
	m.NetworkProgrammingDuration.WithLabelValues(IPv6).Observe(1.5)
	m.SetBuildInfo(BuildInfo{GitVersion: "v0.3.0-rc.1", GitCommit: "abc", GitTreeState: "clean"})
	// A request through client-go's adapters, as the API client makes.
	restClient.requestResult.WithLabelValues("200", "GET", "127.0.0.1:6443").Inc()
	restClient.latency.WithLabelValues("GET", "127.0.0.1:6443").Observe(0.01)

	code, body := get(t, m.Handler("ebpf"), "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics answered %d", code)
	}
	for _, name := range kubeProxyNames {
		if !strings.Contains(body, "\n# TYPE "+name+" ") {
			t.Errorf("scrape lacks metric %s", name)
		}
	}
	for _, series := range []string{
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 0`,
		`kubeproxy_proxy_healthz_total{code="200"} 1`,
		`kubeproxy_proxy_livez_total{code="503"} 1`,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1`,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.004"} 1`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 0`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="1"} 0`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="2"} 1`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 0`,
		`kubernetes_build_info{build_date="",compiler="gc",git_commit="abc",git_tree_state="clean",git_version="v0.3.0-rc.1",go_version="` + runtime.Version() + `",major="0",minor="3",platform="` + runtime.GOOS + "/" + runtime.GOARCH + `"} 1`,
		`rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 1`,
		`kpr_sync_failures_total 0`,
		`kpr_udp_sockets_destroyed_total 0`,
	} {
		if !strings.Contains(body, series+"\n") {
			t.Errorf("scrape lacks series %q", series)
		}
	}
}

func bucketBounds(t *testing.T, m *Metrics, name string) []float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("%s is %v, want a histogram", name, f.GetType())
		}
		var bounds []float64
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		return bounds
	}
	t.Fatalf("metric %s not gathered", name)
	return nil
}

func TestSyncDurationBuckets(t *testing.T) {
	got := bucketBounds(t, New(), "kubeproxy_sync_proxy_rules_duration_seconds")
	if len(got) != 15 {
		t.Fatalf("got %d buckets, want 15: %v", len(got), got)
	}
	want := 0.001
	for i, b := range got {
		if diff := b - want; diff > 1e-12 || diff < -1e-12 {
			t.Errorf("bucket %d is %v, want %v", i, b, want)
		}
		want *= 2
	}
}

func TestNetworkProgrammingBuckets(t *testing.T) {
	got := bucketBounds(t, New(), "kubeproxy_network_programming_duration_seconds")
	var want []float64
	want = append(want, 0.25, 0.5)
	for s := 1.0; s <= 59; s++ {
		want = append(want, s)
	}
	for s := 60.0; s <= 115; s += 5 {
		want = append(want, s)
	}
	for s := 120.0; s <= 300; s += 30 {
		want = append(want, s)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d buckets %v, want %d %v", len(got), got, len(want), want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("bucket %d is %v, want %v", i, got[i], want[i])
		}
	}
}

func TestTwoInstancesDoNotCollide(t *testing.T) {
	a, b := New(), New()
	a.ServiceChangesTotal.Inc()
	_, bodyB := get(t, b.Handler("ebpf"), "/metrics")
	if !strings.Contains(bodyB, "kubeproxy_sync_proxy_rules_service_changes_total 0\n") {
		t.Errorf("second registry saw the first one's counter")
	}
}

func TestProxyModeAndServe(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, lis, New().Handler("ebpf")) }()

	resp, err := http.Get("http://" + lis.Addr().String() + "/proxyMode")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ebpf" {
		t.Errorf("/proxyMode = %d %q, want 200 \"ebpf\"", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("/proxyMode content type %q, want text/plain", ct)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve returned %v after cancel, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after ctx was cancelled")
	}
}

func TestListenAndServeReportsBusyPort(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	err = ListenAndServe(context.Background(), lis.Addr().String(), New().Handler("ebpf"))
	if err == nil {
		t.Fatal("ListenAndServe on a busy port returned nil")
	}
}
