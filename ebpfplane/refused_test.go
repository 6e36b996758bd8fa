package ebpfplane

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

// backends returns n distinct backends.
func backends(n int) []dataplane.Backend {
	out := make([]dataplane.Backend, n)
	for i := range out {
		out[i] = be(fmt.Sprintf("10.244.%d.%d:8080", i/200, i%200+1))
	}
	return out
}

// A ServicePort that does not fit is refused alone: the call succeeds,
// every other ServicePort is written, and the refused one is retried, and
// programmed, once a delete makes room. When not all fit, room goes in name
// order, so the names here decide who is refused.
func TestServicePortThatDoesNotFitIsRefusedAloneAndRetried(t *testing.T) {
	lb := maps.NewInMemory(110, 1000, 1000)
	p := New(lb, nil)
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("a-hog"):   clusterIP("10.96.0.1", backends(20)...),  // 21 entries
		name("b-small"): clusterIP("10.96.0.2", backends(2)...),   // 3 entries
		name("c-big"):   clusterIP("10.96.0.3", backends(100)...), // 101: 125 > 110
	}
	if err := p.Apply(all); err != nil {
		t.Fatalf("Apply failed over one ServicePort that does not fit: %v", err)
	}
	for _, vip := range []string{"10.96.0.1", "10.96.0.2"} {
		if _, ok := lb.Get(key(vip, maps.ScopeInternal)); !ok {
			t.Fatalf("%s was not written beside the refused ServicePort", vip)
		}
	}
	if _, ok := lb.Get(key("10.96.0.3", maps.ScopeInternal)); ok {
		t.Fatal("the ServicePort that does not fit was written anyway")
	}
	refused := p.Refused()
	r, ok := refused[name("c-big")]
	if len(refused) != 1 || !ok || r.Reason != dataplane.RefusedMapFull || !strings.Contains(r.Message, "--map-size-services") {
		t.Fatalf("Refused() = %+v, want big refused as MapFull naming --map-size-services", refused)
	}

	// A Reconcile with nothing new keeps it refused, and succeeds; so
	// does the next one, which finds nothing changed.
	for i := 0; i < 2; i++ {
		if err := p.Reconcile(all); err != nil {
			t.Fatalf("Reconcile failed over a refused ServicePort: %v", err)
		}
		if len(p.Refused()) != 1 || len(lb.List()) != 2 {
			t.Fatalf("after Reconcile: refused %v, maps hold %v", p.Refused(), lb.List())
		}
	}

	// Deleting the hog makes room: the same Apply programs big.
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("a-hog"): nil}); err != nil {
		t.Fatal(err)
	}
	if got, ok := lb.Get(key("10.96.0.3", maps.ScopeInternal)); !ok || len(got.Backends) != 100 {
		t.Fatalf("big was not programmed once room was made: %+v", got)
	}
	if len(p.Refused()) != 0 {
		t.Fatalf("Refused() = %v after big was programmed", p.Refused())
	}
}

// A refused ServicePort that Apply could not retry (the call made no room)
// is retried by the next Reconcile, even when nothing else changed.
func TestReconcileRetriesRefusedServicePort(t *testing.T) {
	lb := maps.NewInMemory(110, 1000, 1000)
	p := New(lb, nil)
	hog := clusterIP("10.96.0.1", backends(20)...)
	big := clusterIP("10.96.0.3", backends(100)...)
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("a-hog"): hog, name("c-big"): big}); err != nil {
		t.Fatal(err)
	}
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{name("a-hog"): hog, name("c-big"): big}
	if err := p.Reconcile(all); err != nil || len(p.Refused()) != 1 {
		t.Fatalf("Reconcile = %v, refused %v; want big refused", err, p.Refused())
	}
	// The hog's deletion reaches the plane only as a Reconcile (say, it
	// was deleted while kpr was down): that Reconcile programs big.
	delete(all, name("a-hog"))
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	if _, ok := lb.Get(key("10.96.0.3", maps.ScopeInternal)); !ok || len(p.Refused()) != 0 {
		t.Fatalf("big not programmed by Reconcile once it fits; refused %v", p.Refused())
	}
}

// A ServicePort is refused whole: one of its frontends alone would fit,
// but serving a Service on some of its addresses only would be worse than
// a clear refusal.
func TestServicePortIsRefusedWhole(t *testing.T) {
	lb := maps.NewInMemory(110, 1000, 1000)
	p := New(lb, nil)
	bs := backends(60) // 61 entries per frontend: one fits, two do not
	sp := &dataplane.ServicePort{Frontends: []dataplane.Frontend{
		{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP, Backends: bs},
		{Addr: netip.MustParseAddr("192.168.1.1"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.NodePort, Backends: bs},
	}}
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("web"): sp}); err != nil {
		t.Fatal(err)
	}
	if got := lb.List(); len(got) != 0 {
		t.Fatalf("the maps hold %d frontends of a refused ServicePort", len(got))
	}
	if len(p.Refused()) != 1 {
		t.Fatalf("Refused() = %v", p.Refused())
	}
}

// Any other write failure still fails the call, so the sync retries it.
func TestOtherWriteErrorsStillFail(t *testing.T) {
	lb := maps.NewInMemory(110, 1000, 1000)
	p := New(lb, nil)
	sctp := clusterIP("10.96.0.1", backends(1)...)
	sctp.Frontends[0].Protocol = dataplane.SCTP
	err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("sctp"): sctp})
	if err == nil || errors.Is(err, maps.ErrMapFull) {
		t.Fatalf("Apply = %v, want the validation error", err)
	}
}

// A frontend holds at most 65535 backends (the master counts its slots
// in 16 bits). A ServicePort with more is refused alone, as one that does
// not fit the maps: a tenant can write EndpointSlices with that many, and
// a failed sync would fail every node's health.
func TestServicePortWithMoreBackendsThanAFrontendHoldsIsRefusedAlone(t *testing.T) {
	lb := maps.NewInMemorySized(nil)
	p := New(lb, nil)
	many := func(n int) []dataplane.Backend {
		out := make([]dataplane.Backend, n)
		a := netip.MustParseAddr("10.240.0.0")
		for i := range out {
			a = a.Next()
			out[i] = dataplane.Backend{Addr: a, Port: 8080}
		}
		return out
	}
	huge := clusterIP("10.96.0.3", many(1<<16)...)
	err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("huge"): huge, name("small"): clusterIP("10.96.0.2", backends(2)...)})
	if err != nil {
		t.Fatalf("Apply failed over a ServicePort with too many backends (every sync would, and /healthz with it): %v", err)
	}
	r, refused := p.Refused()[name("huge")]
	if !refused || len(p.Refused()) != 1 || r.Reason != dataplane.RefusedMapFull || !strings.Contains(r.Message, "65535") {
		t.Fatalf("Refused() = %+v, want only huge, as MapFull naming the limit of 65535", p.Refused())
	}
	if _, ok := lb.Get(key("10.96.0.2", maps.ScopeInternal)); !ok {
		t.Fatal("the other ServicePort was not written")
	}
	if _, ok := lb.Get(key("10.96.0.3", maps.ScopeInternal)); ok {
		t.Fatal("the refused ServicePort was written")
	}
	fits := clusterIP("10.96.0.3", many(1<<16-1)...)
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("huge"): fits}); err != nil {
		t.Fatal(err)
	}
	if got, ok := lb.Get(key("10.96.0.3", maps.ScopeInternal)); !ok || len(got.Backends) != 1<<16-1 || len(p.Refused()) != 0 {
		t.Fatalf("with 65535 backends: served %v with %d backends, refused %v", ok, len(got.Backends), p.Refused())
	}
}
