package health

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpr-io/kpr/metrics"
)

const timeout = 60 * time.Second // 2 × a 30 s syncPeriod

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newProxyServer() (*ProxyServer, *clocktesting.FakePassiveClock, *metrics.Metrics) {
	clk := clocktesting.NewFakePassiveClock(t0)
	m := metrics.New()
	return NewProxyServer(ProxyConfig{Timeout: timeout, Metrics: m, Clock: clk}), clk, m
}

func readyNode() *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
}

// probe queries path and decodes the JSON answer.
func probeProxy(t *testing.T, s *ProxyServer, path string) (int, Status) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s content type %q, want application/json", path, ct)
	}
	var st Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatalf("%s body %q is not JSON: %v", path, rec.Body.String(), err)
	}
	return rec.Code, st
}

func expectCodes(t *testing.T, s *ProxyServer, healthz, livez int) {
	t.Helper()
	if code, _ := probeProxy(t, s, "/healthz"); code != healthz {
		t.Errorf("/healthz = %d, want %d", code, healthz)
	}
	if code, _ := probeProxy(t, s, "/livez"); code != livez {
		t.Errorf("/livez = %d, want %d", code, livez)
	}
	// Live is /livez's verdict, which kpr status reads through the
	// daemon's /kpr/status.
	if live := s.Live(); live != (livez == 200) {
		t.Errorf("Live() = %v with /livez %d", live, livez)
	}
}

func TestQueuedChangeTimesOut(t *testing.T) {
	s, clk, _ := newProxyServer()
	s.SetNode(readyNode())
	expectCodes(t, s, 200, 200)

	s.QueuedUpdate()
	clk.SetTime(t0.Add(timeout))
	expectCodes(t, s, 200, 200) // waited exactly the timeout: not late yet

	clk.SetTime(t0.Add(timeout + time.Second))
	expectCodes(t, s, 503, 503)

	s.Updated()
	expectCodes(t, s, 200, 200)
}

func TestOldestQueuedChangeCounts(t *testing.T) {
	s, clk, _ := newProxyServer()
	s.SetNode(readyNode())
	s.QueuedUpdate()
	clk.SetTime(t0.Add(timeout - time.Second))
	s.QueuedUpdate() // must not restart the wait
	clk.SetTime(t0.Add(timeout + time.Second))
	expectCodes(t, s, 503, 503)
}

func TestSyncedProxyStaysHealthyWithoutChanges(t *testing.T) {
	s, clk, _ := newProxyServer()
	s.SetNode(readyNode())
	s.Updated()
	clk.SetTime(t0.Add(10 * timeout))
	expectCodes(t, s, 200, 200)
}

func TestNodeEligibility(t *testing.T) {
	deleting := readyNode()
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	tainted := readyNode()
	tainted.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	otherTaint := readyNode()
	otherTaint.Spec.Taints = []v1.Taint{{Key: "example.com/other", Effect: v1.TaintEffectNoSchedule}}

	for _, tc := range []struct {
		name     string
		node     *v1.Node
		eligible bool
	}{
		{"unknown node", nil, false},
		{"ready node", readyNode(), true},
		{"node being deleted", deleting, false},
		{"autoscaler taint", tainted, false},
		{"unrelated taint", otherTaint, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := newProxyServer()
			s.SetNode(tc.node)
			want := 200
			if !tc.eligible {
				want = 503
			}
			expectCodes(t, s, want, 200) // /livez ignores the node
			_, st := probeProxy(t, s, "/healthz")
			if st.NodeEligible == nil || *st.NodeEligible != tc.eligible {
				t.Errorf("nodeEligible = %v, want %v", st.NodeEligible, tc.eligible)
			}
			if _, st := probeProxy(t, s, "/livez"); st.NodeEligible != nil {
				t.Errorf("/livez reported nodeEligible %v, kube-proxy omits it", *st.NodeEligible)
			}
		})
	}
}

func TestNodeRecovers(t *testing.T) {
	s, _, _ := newProxyServer()
	tainted := readyNode()
	tainted.Spec.Taints = []v1.Taint{{Key: ToBeDeletedTaint}}
	s.SetNode(tainted)
	expectCodes(t, s, 503, 200)
	s.SetNode(readyNode())
	expectCodes(t, s, 200, 200)
}

func TestBodyTimes(t *testing.T) {
	s, clk, _ := newProxyServer()
	s.SetNode(readyNode())
	s.Updated() // at t0
	s.QueuedUpdate()
	now := t0.Add(timeout + time.Minute)
	clk.SetTime(now)

	_, st := probeProxy(t, s, "/healthz")
	if st.Healthy || !st.LastUpdated.Equal(t0) || !st.CurrentTime.Equal(now) {
		t.Errorf("unhealthy body = %+v, want healthy=false lastUpdated=%v currentTime=%v", st, t0, now)
	}
	s.Updated()
	_, st = probeProxy(t, s, "/healthz")
	if !st.Healthy || !st.LastUpdated.Equal(now) {
		t.Errorf("healthy body = %+v, want healthy=true lastUpdated=%v", st, now)
	}
}

func TestProbesAreCounted(t *testing.T) {
	s, _, m := newProxyServer()
	probeProxy(t, s, "/healthz") // no node yet: 503
	s.SetNode(readyNode())
	probeProxy(t, s, "/healthz")
	probeProxy(t, s, "/healthz")
	probeProxy(t, s, "/livez")
	for _, c := range []struct {
		got  float64
		want float64
		what string
	}{
		{counted(t, m.HealthzTotal.WithLabelValues("503")), 1, "healthz 503"},
		{counted(t, m.HealthzTotal.WithLabelValues("200")), 2, "healthz 200"},
		{counted(t, m.LivezTotal.WithLabelValues("200")), 1, "livez 200"},
	} {
		if c.got != c.want {
			t.Errorf("%s counted %v, want %v", c.what, c.got, c.want)
		}
	}
}

func counted(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
