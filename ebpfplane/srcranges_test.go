package ebpfplane

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/maps"
)

func fenced(ranges ...string) *dataplane.ServicePort {
	sp := &dataplane.ServicePort{Frontends: []dataplane.Frontend{
		{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.ClusterIP, Backends: []dataplane.Backend{be("10.244.0.2:8080")}},
		{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.LoadBalancer,
			Backends: []dataplane.Backend{be("10.244.0.2:8080")}, ExternalBackends: []dataplane.Backend{be("10.244.0.2:8080")}},
	}}
	for _, r := range ranges {
		sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(r))
	}
	return sp
}

var lbVIP = maps.VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}

// The LoadBalancer frontend's masters (both scopes) ask for the ranges,
// which the source-range map holds; the ClusterIP is left alone. Changing
// the ranges replaces them, dropping them clears the flag and the map.
func TestSourceRangesFollowTheServicePort(t *testing.T) {
	lb := maps.NewInMemory(100, 100, 100)
	p := New(lb, nil)
	apply := func(sp *dataplane.ServicePort) {
		t.Helper()
		if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("fenced"): sp}); err != nil {
			t.Fatal(err)
		}
	}
	flags := func() (internal, external, cluster bool) {
		i, _ := lb.Get(maps.VIPKey{VIP: lbVIP, Scope: maps.ScopeInternal})
		e, _ := lb.Get(maps.VIPKey{VIP: lbVIP, Scope: maps.ScopeExternal})
		c, _ := lb.Get(key("10.96.0.1", maps.ScopeInternal))
		return len(i.SourceRanges) > 0, len(e.SourceRanges) > 0, len(c.SourceRanges) > 0
	}
	apply(fenced("10.0.0.0/8", "2001:db8::/32"))
	if i, e, c := flags(); !i || !e || c {
		t.Errorf("flags internal=%v external=%v clusterIP=%v, want the LoadBalancer's scopes only", i, e, c)
	}
	// The IPv6 range is not this frontend's family.
	if got := lb.SourceRanges().Get(lbVIP); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}) {
		t.Errorf("map holds %v for %s, want [10.0.0.0/8]", got, lbVIP)
	}
	apply(fenced("192.168.0.0/16"))
	if got := lb.SourceRanges().Get(lbVIP); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}) {
		t.Errorf("after a change the map holds %v, want [192.168.0.0/16]", got)
	}
	// Only ranges of another family: the frontend is open.
	apply(fenced("2001:db8::/32"))
	if i, e, _ := flags(); i || e {
		t.Error("a frontend without ranges of its family still asks for them")
	}
	if got := lb.SourceRanges().VIPs(); len(got) != 0 {
		t.Errorf("ranges left for %v", got)
	}
	apply(fenced("10.0.0.0/8"))
	apply(nil)
	if got := lb.SourceRanges().VIPs(); len(got) != 0 {
		t.Errorf("ranges left for %v after the ServicePort was deleted", got)
	}
}

// A Reconcile removes ranges nobody has, such as those a restarted kpr
// adopts for a Service deleted while it was down.
func TestReconcileRemovesStaleSourceRanges(t *testing.T) {
	lb := maps.NewInMemory(100, 100, 100)
	if err := New(lb, nil).Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("gone"): fenced("10.0.0.0/8")}); err != nil {
		t.Fatal(err)
	}
	restarted := lb.ReopenInMemory(false)
	if err := New(restarted, nil).Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	if got := restarted.SourceRanges().VIPs(); len(got) != 0 {
		t.Errorf("Reconcile left ranges for %v", got)
	}
}

// A ServicePort refused for lack of room keeps its earlier masters, and so
// the source ranges they ask for: none of the new ones, all of the old.
func TestRefusedServicePortKeepsItsOldSourceRanges(t *testing.T) {
	lb := maps.NewInMemory(20, 1000, 1000)
	p := New(lb, nil)
	apply := func(sp *dataplane.ServicePort) {
		t.Helper()
		if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("fenced"): sp}); err != nil {
			t.Fatal(err)
		}
	}
	apply(fenced("10.0.0.0/8"))
	big := fenced("192.168.0.0/16")
	for i := range big.Frontends {
		big.Frontends[i].Backends = backends(30)
	}
	apply(big)
	if _, refused := p.Refused()[name("fenced")]; !refused {
		t.Fatal("the grown ServicePort was not refused; the test needs it to be")
	}
	if got := lb.SourceRanges().Get(lbVIP); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}) {
		t.Errorf("a refused ServicePort left %v in the map, want its old [10.0.0.0/8]", got)
	}
	if svc, _ := lb.Get(maps.VIPKey{VIP: lbVIP, Scope: maps.ScopeInternal}); len(svc.SourceRanges) == 0 {
		t.Error("the refused ServicePort's old master lost its source-range flag")
	}
}
