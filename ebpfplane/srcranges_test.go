package ebpfplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/bpf"
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

// prefixes returns n distinct IPv4 /24s.
func prefixes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	return out
}

// fencedAt is fenced with the LoadBalancer frontend at lbIP.
func fencedAt(lbIP string, ranges ...string) *dataplane.ServicePort {
	sp := fenced(ranges...)
	sp.Frontends = sp.Frontends[1:] // a ClusterIP each would collide
	sp.Frontends[0].Addr = netip.MustParseAddr(lbIP)
	return sp
}

// More loadBalancerSourceRanges than kpr_src_ranges has room for refuse
// that ServicePort alone, as a full service map does: the call succeeds
// (a failed sync would make every node's /healthz fail), the Service keeps
// what it served, the others are untouched, and it is programmed once
// room is made.
func TestSourceRangesBeyondTheMapAreRefusedAlone(t *testing.T) {
	lb := maps.NewInMemorySized(map[string]int{bpf.KprMapKprSrcRanges: 10})
	p := New(lb, nil)
	apply := func(changes map[dataplane.ServicePortName]*dataplane.ServicePort) {
		t.Helper()
		if err := p.Apply(changes); err != nil {
			t.Fatalf("Apply failed (every sync would, and /healthz with it): %v", err)
		}
	}
	hog, small := fencedAt("203.0.113.1", prefixes(6)...), fencedAt("203.0.113.2", prefixes(2)...)
	apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("a-hog"): hog, name("b-small"): small})

	// c grows from 1 range to 5: 6+2+5 > 10.
	was := fencedAt("203.0.113.3", prefixes(1)...)
	apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("c-big"): was})
	apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("c-big"): fencedAt("203.0.113.3", prefixes(5)...)})
	r, refused := p.Refused()[name("c-big")]
	if !refused || len(p.Refused()) != 1 || r.Reason != dataplane.RefusedMapFull ||
		!strings.Contains(r.Message, bpf.KprMapKprSrcRanges) || !strings.Contains(r.Message, "--map-size-src-ranges") {
		t.Fatalf("Refused() = %+v, want only c-big, as MapFull naming %s and the flag to raise", p.Refused(), bpf.KprMapKprSrcRanges)
	}
	for ip, want := range map[string]int{"203.0.113.1": 6, "203.0.113.2": 2, "203.0.113.3": 1} {
		vip := maps.VIP{Addr: netip.MustParseAddr(ip), Port: 80, Proto: dataplane.TCP}
		if got := lb.SourceRanges().Get(vip); len(got) != want {
			t.Errorf("%s holds %v, want its %d ranges as before", ip, got, want)
		}
		if svc, ok := lb.Get(maps.VIPKey{VIP: vip, Scope: maps.ScopeExternal}); !ok || len(svc.SourceRanges) != want {
			t.Errorf("%s is served as %+v, want its previous state", ip, svc)
		}
	}
	if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{
		name("a-hog"): hog, name("b-small"): small, name("c-big"): fencedAt("203.0.113.3", prefixes(5)...)}); err != nil {
		t.Fatalf("Reconcile failed over the refused ServicePort: %v", err)
	}

	// Deleting the hog frees ranges only in kpr_src_ranges' terms too.
	apply(map[dataplane.ServicePortName]*dataplane.ServicePort{name("a-hog"): nil})
	if len(p.Refused()) != 0 {
		t.Fatalf("Refused() = %v once room was made", p.Refused())
	}
	if got := lb.SourceRanges().Get(maps.VIP{Addr: netip.MustParseAddr("203.0.113.3"), Port: 80, Proto: dataplane.TCP}); len(got) != 5 {
		t.Fatalf("c-big holds %v once room was made, want 5 ranges", got)
	}
}
