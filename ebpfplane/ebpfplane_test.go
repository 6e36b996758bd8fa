package ebpfplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/metrics"
)

func be(s string) dataplane.Backend {
	ap := netip.MustParseAddrPort(s)
	return dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}
}

func name(n string) dataplane.ServicePortName {
	return dataplane.ServicePortName{Namespace: "default", Name: n, Protocol: dataplane.TCP}
}

func clusterIP(vip string, backends ...dataplane.Backend) *dataplane.ServicePort {
	return &dataplane.ServicePort{Frontends: []dataplane.Frontend{{
		Addr: netip.MustParseAddr(vip), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP, Backends: backends}}}
}

func key(vip string, scope maps.Scope) maps.VIPKey {
	return maps.VIPKey{VIP: maps.VIP{Addr: netip.MustParseAddr(vip), Port: 80, Proto: dataplane.TCP}, Scope: scope}
}

func TestApplyWritesScopesAndDeletesDroppedFrontends(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	local, remote := be("10.244.0.2:8080"), be("10.244.1.2:8080")
	sp := &dataplane.ServicePort{
		AffinityTimeout: 30 * time.Second,
		Frontends: []dataplane.Frontend{
			{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP,
				Backends: []dataplane.Backend{local, remote}},
			{Addr: netip.MustParseAddr("192.168.1.1"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.NodePort,
				Backends: []dataplane.Backend{local, remote}, ExternalBackends: []dataplane.Backend{local}},
		},
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): sp}); err != nil {
		t.Fatal(err)
	}
	ext, ok := lb.Get(key("192.168.1.1", maps.ScopeExternal))
	if !ok || len(ext.Backends) != 1 || ext.Backends[0] != local {
		t.Fatalf("external scope = %+v, want only the local backend", ext)
	}
	internal, _ := lb.Get(key("192.168.1.1", maps.ScopeInternal))
	if len(internal.Backends) != 2 || internal.AffinityTimeout != 30 || internal.Kind != dataplane.NodePort {
		t.Fatalf("internal scope = %+v", internal)
	}
	if _, ok := lb.Get(key("10.96.0.1", maps.ScopeExternal)); ok {
		t.Fatal("a frontend without ExternalBackends got an external scope")
	}

	// The NodePort goes away: its entries must go with it. (A new
	// ServicePort: the contract says a handed-over one is never modified.)
	next := *sp
	next.Frontends = sp.Frontends[:1]
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): &next}); err != nil {
		t.Fatal(err)
	}
	if len(lb.List()) != 1 {
		t.Fatalf("after dropping the NodePort the maps hold %v", lb.List())
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): nil}); err != nil {
		t.Fatal(err)
	}
	if len(lb.List()) != 0 {
		t.Fatalf("after deleting the ServicePort the maps hold %v", lb.List())
	}
}

func TestReconcileRemovesUnknownAndRepairs(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	// Left over from before a restart: one Service that still exists, one
	// that was deleted while kpr was down.
	stay := maps.Service{VIPKey: key("10.96.0.1", maps.ScopeInternal), Backends: []dataplane.Backend{be("10.244.0.2:8080")}}
	gone := maps.Service{VIPKey: key("10.96.0.2", maps.ScopeInternal), Backends: []dataplane.Backend{be("10.244.0.3:8080")}}
	if err := lb.Upsert(stay, gone); err != nil {
		t.Fatal(err)
	}
	p := New(lb, nil)
	err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("stay"): clusterIP("10.96.0.1", be("10.244.0.2:8080"), be("10.244.0.4:8080")),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := lb.Get(gone.VIPKey); ok {
		t.Fatal("a Service deleted while kpr was down survived reconcile")
	}
	got, _ := lb.Get(stay.VIPKey)
	if len(got.Backends) != 2 {
		t.Fatalf("reconcile did not update the surviving Service: %v", got.Backends)
	}
}

func TestReconcileOfUnchangedStateWritesNothingButStillRepairs(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): clusterIP("10.96.0.1", be("10.244.0.2:8080"))}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	// The same ServicePorts again: the fast path.
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if _, ok := lb.Get(key("10.96.0.1", maps.ScopeInternal)); !ok {
		t.Fatal("service lost")
	}
	// An Apply in between updates what the fast path compares against.
	changed := clusterIP("10.96.0.1", be("10.244.0.3:8080"))
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): changed}); err != nil {
		t.Fatal(err)
	}
	all[name("web")] = changed
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	got, _ := lb.Get(key("10.96.0.1", maps.ScopeInternal))
	if len(got.Backends) != 1 || got.Backends[0] != be("10.244.0.3:8080") {
		t.Fatalf("after apply + reconcile the maps hold %v", got.Backends)
	}
	// A ServicePort the maps never got (new pointer) takes the slow path.
	all[name("api")] = clusterIP("10.96.0.2", be("10.244.0.4:8080"))
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if _, ok := lb.Get(key("10.96.0.2", maps.ScopeInternal)); !ok {
		t.Fatal("a new ServicePort in a reconcile was not written")
	}
}

// runDriftCheck steps a drift check of p to its end.
func runDriftCheck(t *testing.T, p *Plane) bool {
	t.Helper()
	c := p.StartDriftCheck()
	for range 1000 {
		done, held, err := c.Step()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return held
		}
	}
	t.Fatal("drift check does not end")
	return false
}

// The drift check holds the maps as they are only while every call since
// the last Reconcile succeeded: after a failure only a Reconcile can vouch
// for them, even if nothing in the maps drifted.
func TestDriftCheckAsksForReconcileAfterAFailedCall(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): clusterIP("10.96.0.1", be("10.244.0.2:8080"))}
	if runDriftCheck(t, p) {
		t.Fatal("a Plane that was never reconciled vouched for adopted maps")
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if !runDriftCheck(t, p) {
		t.Fatal("the drift check after a Reconcile does not hold the maps")
	}
	sctp := clusterIP("10.96.0.9", be("10.244.0.3:8080"))
	sctp.Frontends[0].Protocol = dataplane.SCTP
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("sctp"): sctp}); err == nil {
		t.Fatal("an SCTP frontend was accepted")
	}
	if runDriftCheck(t, p) {
		t.Fatal("the drift check holds the maps after a failed Apply")
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if !runDriftCheck(t, p) {
		t.Fatal("a Reconcile after the failure did not make the maps trusted again")
	}
}

// The backend publishes its own map fill levels after every call, so the
// gauges follow the maps without the caller knowing about maps.
func TestMapUsageIsPublishedAfterEveryCall(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	m := metrics.New()
	p.PublishMapUsage(m)
	services := lb.Usage()[0].Map
	entries := func() float64 { return gaugeValue(t, m.MapEntries.WithLabelValues(services)) }
	if got := gaugeValue(t, m.MapMaxEntries.WithLabelValues(services)); got != 1000 {
		t.Fatalf("max entries gauge = %v, want 1000", got)
	}
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): clusterIP("10.96.0.1", be("10.244.0.2:8080"), be("10.244.0.3:8080"))}); err != nil {
		t.Fatal(err)
	}
	if got := entries(); got != 3 {
		t.Fatalf("after a Reconcile the entries gauge = %v, want 3 (master and two slots)", got)
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): nil}); err != nil {
		t.Fatal(err)
	}
	if got := entries(); got != 0 {
		t.Fatalf("after deleting the Service the entries gauge = %v, want 0", got)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var out dto.Metric
	if err := g.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetGauge().GetValue()
}
