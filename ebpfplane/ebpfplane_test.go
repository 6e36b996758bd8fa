package ebpfplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
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

	// The NodePort goes away: its entries must go with it.
	sp.Frontends = sp.Frontends[:1]
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): sp}); err != nil {
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

func TestConflictingFrontendKeepsTheFirstOwner(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	a, b := be("10.244.0.2:8080"), be("10.244.0.3:8080")
	err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("a"): clusterIP("10.96.0.1", a),
		name("b"): clusterIP("10.96.0.1", b),
	})
	if err != nil {
		t.Fatalf("a conflict between Services failed the whole sync: %v", err)
	}
	got, _ := lb.Get(key("10.96.0.1", maps.ScopeInternal))
	if len(got.Backends) != 1 || got.Backends[0] != a {
		t.Fatalf("frontend serves %v, want the first owner's backend", got.Backends)
	}
	// Deleting the loser must not delete the winner's frontend.
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("b"): nil}); err != nil {
		t.Fatal(err)
	}
	if _, ok := lb.Get(key("10.96.0.1", maps.ScopeInternal)); !ok {
		t.Fatal("deleting the conflicting ServicePort removed the owner's frontend")
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

func TestClusterIPKeepsItsFrontendAgainstAnExternalIP(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	mine, intruder := be("10.244.0.2:8080"), be("10.244.0.9:8080")
	// "a-intruder" sorts first and claims 10.96.0.1:80 as an external IP.
	external := &dataplane.ServicePort{Frontends: []dataplane.Frontend{{
		Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ExternalIP,
		Backends: []dataplane.Backend{intruder}}}}
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("a-intruder"): external,
		name("b-owner"):    clusterIP("10.96.0.1", mine),
	}
	for _, sync := range []func() error{func() error { return p.Reconcile(all) }, func() error { return p.Apply(all) }} {
		if err := sync(); err != nil {
			t.Fatal(err)
		}
		got, _ := lb.Get(key("10.96.0.1", maps.ScopeInternal))
		if len(got.Backends) != 1 || got.Backends[0] != mine {
			t.Fatalf("ClusterIP serves %v, want its own Service's backend", got.Backends)
		}
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

// A frontend refused to one Service goes to it once its owner leaves, at
// the next Reconcile, even though every ServicePort is as it was handed
// over (the fast path); a drift check asks for that Reconcile.
func TestOwnerLeavingHandsTheContestedFrontendOver(t *testing.T) {
	lb := maps.NewInMemory(1000, 1000, 1000)
	p := New(lb, nil)
	a, b := be("10.244.0.2:8080"), be("10.244.0.3:8080")
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("a"): clusterIP("10.96.0.1", a),
		name("b"): clusterIP("10.96.0.1", b),
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if !runDriftCheck(t, p) {
		t.Fatal("a conflict whose owner is still there made the drift check ask for a Reconcile")
	}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("a"): nil}); err != nil {
		t.Fatal(err)
	}
	delete(all, name("a"))
	if runDriftCheck(t, p) {
		t.Fatal("the owner of a contested frontend left, but the drift check holds the maps as they are")
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	got, _ := lb.Get(key("10.96.0.1", maps.ScopeInternal))
	if len(got.Backends) != 1 || got.Backends[0] != b {
		t.Fatalf("after the owner left and a Reconcile, the frontend serves %v, want b's backend", got.Backends)
	}
	if !runDriftCheck(t, p) {
		t.Fatal("drift check after the handover does not hold the maps")
	}
}
