package watcher

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/desired"
	"github.com/kpr-io/kpr/metrics"
)

func TestStartsWithFullReconcile(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.1")
	h.putService("b", "10.96.0.2")
	h.start()

	c := h.nextCall()
	if !c.reconcile {
		t.Fatal("first call was Apply, want Reconcile")
	}
	expectPorts(t, c, []string{"a", "b"}, nil)
	if got := backends(c.ports[portName("a")]); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("a's backends = %v", got)
	}
	select {
	case <-h.runner.firstSync:
	case <-time.After(5 * time.Second):
		t.Error("firstSync not closed after a successful full reconcile")
	}
	// Everything queued before start-up was covered by the reconcile.
	h.noCall(100 * time.Millisecond)
}

func TestAppliesOnlyChangedServicePorts(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.2")
	h.start()
	h.nextCall() // start-up reconcile

	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.1", "10.0.0.3")
	c := h.nextCall()
	if c.reconcile {
		t.Fatal("got Reconcile, want Apply")
	}
	expectPorts(t, c, []string{"a"}, nil)
	if got := backends(c.ports[portName("a")]); !slices.Equal(got, []string{"10.0.0.1:8080", "10.0.0.3:8080"}) {
		t.Errorf("a's backends = %v", got)
	}

	// An event that changes nothing in the desired state costs a sync but
	// no dataplane call.
	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.2")
	if r := h.syncSeeingAll(); r.ServicePorts != 0 {
		t.Errorf("no-op sync handed %d ServicePorts to the dataplane", r.ServicePorts)
	}
	h.noCall(50 * time.Millisecond)
}

func TestDeletionAppliesNil(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.start()
	h.nextCall()

	h.deleteService("a")
	expectPorts(t, h.nextCall(), nil, []string{"a"})

	// A Service becoming headless loses its ports the same way.
	h.putService("b", v1.ClusterIPNone)
	expectPorts(t, h.nextCall(), nil, []string{"b"})

	// Deleting what is already gone sends nothing.
	h.deleteService("a")
	h.noCall(100 * time.Millisecond)
}

func TestCoalescesChangesWithinMinSyncPeriod(t *testing.T) {
	h := newHarness(t, harnessOptions{minSyncPeriod: 400 * time.Millisecond})
	h.start()
	c := h.nextCall()
	if !c.reconcile || len(c.ports) != 0 {
		t.Fatalf("start-up call = reconcile %v with %d ports, want an empty Reconcile", c.reconcile, len(c.ports))
	}
	start := time.Now()
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.putService("c", "10.96.0.3")
	h.putEndpoints("a", "node-a", time.Time{}, "10.0.0.1")

	c = h.nextCall()
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("sync after %v, want it held back by the 400ms MinSyncPeriod", waited)
	}
	expectPorts(t, c, []string{"a", "b", "c"}, nil)
	if got := backends(c.ports[portName("a")]); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("a's backends = %v, want the latest state", got)
	}
	h.noCall(600 * time.Millisecond)
}

func TestRetriesFailedApplyWithoutLosingChanges(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.putService("a", "10.96.0.1")
	h.putService("b", "10.96.0.2")
	h.start()
	h.nextCall()

	h.dp.failCalls(2)
	h.deleteService("a")
	first := h.nextCall()
	if first.err == nil {
		t.Fatal("the injected failure did not happen")
	}
	expectPorts(t, first, nil, []string{"a"})
	// A change arriving while the loop backs off joins the retry.
	h.putEndpoints("b", "node-a", time.Time{}, "10.0.0.2")

	var last dpCall
	for last = h.nextCall(); last.err != nil; last = h.nextCall() {
	}
	if last.reconcile {
		t.Fatal("retry was a Reconcile, want Apply")
	}
	expectPorts(t, last, []string{"b"}, []string{"a"})
	if got := backends(last.ports[portName("b")]); !slices.Equal(got, []string{"10.0.0.2:8080"}) {
		t.Errorf("b's backends = %v", got)
	}
	h.syncSeeingAll()
	if q, u := h.health.counts(); q == 0 || u != 2 {
		t.Errorf("health saw %d queued and %d updated, want some queued and 2 updates (start-up, retry)", q, u)
	}
	if n := counterValue(t, h.metrics.SyncFailuresTotal); n != 2 {
		t.Errorf("kpr_sync_failures_total = %v after 2 failed syncs", n)
	}
	h.noCall(100 * time.Millisecond)
}

func TestRetriesFailedStartupReconcile(t *testing.T) {
	h := newHarness(t, harnessOptions{failFirstCalls: 1})
	h.putService("a", "10.96.0.1")
	h.start()
	if c := h.nextCall(); !c.reconcile || c.err == nil {
		t.Fatalf("first call: reconcile=%v err=%v, want a failed Reconcile", c.reconcile, c.err)
	}
	select {
	case <-h.runner.firstSync:
		t.Fatal("firstSync closed although the reconcile failed")
	default:
	}
	h.putService("b", "10.96.0.2")
	c := h.nextCall()
	if !c.reconcile || c.err != nil {
		t.Fatalf("retry: reconcile=%v err=%v, want a successful Reconcile", c.reconcile, c.err)
	}
	expectPorts(t, c, []string{"a", "b"}, nil)
	<-h.runner.firstSync
}

func TestPeriodicFullReconcile(t *testing.T) {
	h := newHarness(t, harnessOptions{syncPeriod: 150 * time.Millisecond})
	h.putService("a", "10.96.0.1")
	h.start()
	for i := 0; i < 3; i++ {
		c := h.nextCall()
		if !c.reconcile {
			t.Fatalf("call %d was Apply; without events only Reconciles are due", i)
		}
		expectPorts(t, c, []string{"a"}, nil)
	}
}

func TestNodeChangeRecomputesEveryService(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	local := v1.ServiceInternalTrafficPolicyLocal
	h.putService("local", "10.96.0.1", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local })
	h.putEndpoints("local", "node-b", time.Time{}, "10.0.0.1")
	h.putService("cluster", "10.96.0.2")
	h.putEndpoints("cluster", "node-b", time.Time{}, "10.0.0.2")
	h.start()
	c := h.nextCall()
	if got := backends(c.ports[portName("local")]); len(got) != 0 {
		t.Fatalf("local Service has backends %v on node-a", got)
	}

	// Renaming the node makes node-b's endpoints local. Only the Service
	// whose state changes is applied.
	h.setNode(desired.Node{Name: "node-b", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}})
	c = h.nextCall()
	expectPorts(t, c, []string{"local"}, nil)
	if got := backends(c.ports[portName("local")]); !slices.Equal(got, []string{"10.0.0.1:8080"}) {
		t.Errorf("local's backends = %v", got)
	}
}

func TestMetricsAfterSync(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	local := v1.ServiceInternalTrafficPolicyLocal
	h.putService("a", "10.96.0.1", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local })
	h.start()
	h.nextCall()

	if v := gaugeValue(t, h.metrics.ServiceChangesPending); v != 0 {
		t.Errorf("service changes pending %v after sync, want 0", v)
	}
	h.putEndpoints("a", "node-b", time.Now().Add(-2*time.Second), "10.0.0.1")
	h.putEndpoints("a", "node-b", time.Time{}, "10.0.0.1") // not timed: no newer trigger
	h.syncSeeingAll()

	if v := counterValue(t, h.metrics.ServiceChangesTotal); v != 1 {
		t.Errorf("service changes total %v, want 1", v)
	}
	if v := counterValue(t, h.metrics.EndpointChangesTotal); v != 2 {
		t.Errorf("endpoint changes total %v, want 2", v)
	}
	if v := gaugeValue(t, h.metrics.EndpointChangesPending); v != 0 {
		t.Errorf("endpoint changes pending %v after sync, want 0", v)
	}
	if v := gaugeValue(t, h.metrics.SyncProxyRulesLastTimestamp.WithLabelValues(metrics.IPv6)); time.Since(time.Unix(int64(v), 0)) > time.Minute {
		t.Errorf("last sync timestamp %v is not recent", v)
	}
	if v := gaugeValue(t, h.metrics.NoLocalEndpoints.WithLabelValues(metrics.TrafficPolicyInternal, metrics.IPv4)); v != 1 {
		t.Errorf("no local endpoints (internal, IPv4) = %v, want 1: endpoints exist on node-b only", v)
	}
	// The Service is IPv4 only, as kube-proxy's IPv6 proxier would not count it.
	if v := gaugeValue(t, h.metrics.NoLocalEndpoints.WithLabelValues(metrics.TrafficPolicyInternal, metrics.IPv6)); v != 0 {
		t.Errorf("no local endpoints (internal, IPv6) = %v, want 0 for an IPv4 Service", v)
	}
	hist := histogram(t, h.metrics.NetworkProgrammingDuration.WithLabelValues(metrics.IPv4).(prometheus.Histogram))
	if hist.GetSampleCount() != 1 || hist.GetSampleSum() < 2 {
		t.Errorf("network programming latency: %d samples summing to %vs, want 1 sample ≥ 2s",
			hist.GetSampleCount(), hist.GetSampleSum())
	}
	if n := histogram(t, h.metrics.SyncProxyRulesDuration.WithLabelValues(metrics.IPv4).(prometheus.Histogram)).GetSampleCount(); n < 2 {
		t.Errorf("sync duration has %d samples, want one per sync", n)
	}
}

func TestProblemsAreLoggedOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{syncPeriod: 50 * time.Millisecond})
	// A second port numbered 0: desired leaves it out and reports why.
	portZero := func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "zero", Port: 0, Protocol: v1.ProtocolTCP})
	}
	h.putService("bad", "10.96.0.1", portZero)
	h.start()
	for i := 0; i < 4; i++ { // several full syncs
		h.nextCall()
	}
	if n := h.logs.FilterMessage("Ignoring unusable part of a Service").Len(); n != 1 {
		t.Errorf("problem logged %d times over 4 syncs, want once", n)
	}
	// Fixed, then broken again: logged again.
	h.putService("bad", "10.96.0.1")
	h.syncSeeingAll()
	h.putService("bad", "10.96.0.1", portZero)
	h.syncSeeingAll()
	if n := h.logs.FilterMessage("Ignoring unusable part of a Service").Len(); n != 2 {
		t.Errorf("problem logged %d times after it came back, want 2", n)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func histogram(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}

// A sync cut short because kpr is stopping (SIGTERM kills a running
// iptables-restore) is no failure to report or retry: the loop ends and
// says so at info level.
func TestStopDuringASyncIsNoFailure(t *testing.T) {
	h := newHarness(t, harnessOptions{failFirstCalls: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.dp.onFail = cancel // the startup reconcile fails as kpr stops
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.runner.run(ctx)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not end after its context did")
	}
	if errs := h.logs.FilterLevelExact(zap.ErrorLevel).All(); len(errs) != 0 {
		t.Errorf("a sync cut short by the stop was logged as an error: %q", errs[0].Message)
	}
	if h.logs.FilterMessageSnippet("Stopped in the middle of a sync").Len() != 1 {
		t.Error("the stop in the middle of a sync was not logged")
	}
}
