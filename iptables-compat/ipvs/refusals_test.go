package ipvs

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/netfilter/netfiltertest"
)

// limitedPlane is a Plane over an empty in-memory kernel with limits.
func limitedPlane(t *testing.T, limits Limits) (*Plane, func() dataplanetest.State) {
	t.Helper()
	k, run := newFakeKernel(), netfiltertest.NewIPTables()
	p, err := New(Options{Kernel: k, Runner: run, Limits: limits, Log: zaptest.NewLogger(t),
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)}})
	if err != nil {
		t.Fatal(err)
	}
	return p, func() dataplanetest.State {
		t.Helper()
		s, err := observed(k, run, netfilter.NFT, nodeAddrs)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// localLB is a LoadBalancer IP under externalTrafficPolicy Local with a
// remote endpoint too, so the node's own traffic needs a firewall mark.
func localLB(i int) *dataplane.ServicePort {
	all := backends(fmt.Sprintf("10.244.0.%d:8080", i+1), fmt.Sprintf("10.244.1.%d:8080", i+1))
	return &dataplane.ServicePort{Name: dataplane.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("lb-%d", i), Protocol: dataplane.TCP},
		Frontends: []dataplane.Frontend{fe(dataplane.LoadBalancer, fmt.Sprintf("198.51.100.%d:443", i+1), dataplane.TCP, all, all[:1])}}
}

// servesLB reports whether the load-balancer IP of localLB(i) is served.
func servesLB(s dataplanetest.State, i int) bool {
	_, ok := s[dataplanetest.Key{Addr: netip.MustParseAddr(fmt.Sprintf("198.51.100.%d", i+1)), Port: 443,
		Protocol: dataplane.TCP, Traffic: dataplanetest.External}]
	return ok
}

// expectRefusedAlone fails unless exactly name is refused, for lack of
// room, with a message naming what.
func expectRefusedAlone(t *testing.T, p *Plane, name dataplane.ServicePortName, what string) {
	t.Helper()
	got := p.Refused()
	r, ok := got[name]
	if len(got) != 1 || !ok || r.Reason != dataplane.RefusedMapFull || !strings.Contains(r.Message, what) {
		t.Fatalf("Refused() = %+v, want only %s, as %s naming %q", got, name, dataplane.RefusedMapFull, what)
	}
}

// Running out of firewall marks refuses the ServicePort that needs one
// more, alone: the call succeeds (a failed sync would fail /healthz on
// every node), the others serve on, and it is programmed once a mark is
// free.
func TestOutOfFirewallMarksRefusesTheServicePortAlone(t *testing.T) {
	p, served := limitedPlane(t, Limits{FirewallMarks: 3})
	for i := range 4 {
		sp := localLB(i)
		if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
			t.Fatalf("Apply of ServicePort %d failed (every sync would, and /healthz with it): %v", i, err)
		}
	}
	expectRefusedAlone(t, p, localLB(3).Name, "firewall mark")
	s := served()
	for i := range 3 {
		if !servesLB(s, i) {
			t.Errorf("ServicePort %d is not served beside the refused one", i)
		}
	}
	if servesLB(s, 3) {
		t.Error("the refused ServicePort is served")
	}
	all := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for i := range 4 {
		all[localLB(i).Name] = localLB(i)
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatalf("Reconcile failed over the refused ServicePort: %v", err)
	}
	expectRefusedAlone(t, p, localLB(3).Name, "firewall mark")

	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{localLB(0).Name: nil}); err != nil {
		t.Fatal(err)
	}
	if len(p.Refused()) != 0 || !servesLB(served(), 3) {
		t.Fatalf("once a mark was freed: refused %v, ServicePort 3 served %v", p.Refused(), servesLB(served(), 3))
	}
}

// A full ipset refuses the ServicePort that would add to it, alone; one
// whose update does not fit keeps what it served.
func TestFullIPSetRefusesTheServicePortAlone(t *testing.T) {
	set := setName(setSourceCIDR, false)
	p, served := limitedPlane(t, Limits{SetSizes: map[string]int{set: 4}})
	fencedLB := func(i int, ranges ...string) *dataplane.ServicePort {
		sp := localLB(i)
		for _, r := range ranges {
			sp.SourceRanges = append(sp.SourceRanges, netip.MustParsePrefix(r))
		}
		return sp
	}
	apply := func(sp *dataplane.ServicePort) {
		t.Helper()
		if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
			t.Fatalf("Apply failed (every sync would, and /healthz with it): %v", err)
		}
	}
	apply(fencedLB(0, "10.0.0.0/8", "10.1.0.0/16"))
	apply(fencedLB(1, "10.2.0.0/16"))
	apply(fencedLB(1, "10.2.0.0/16", "10.3.0.0/16", "10.4.0.0/16")) // 2+3 > 4
	expectRefusedAlone(t, p, localLB(1).Name, set)
	s := served()
	lb1 := dataplanetest.Key{Addr: netip.MustParseAddr("198.51.100.2"), Port: 443, Protocol: dataplane.TCP, Traffic: dataplanetest.External}
	if got := s[lb1].SourceRanges; len(got) != 1 || !servesLB(s, 0) {
		t.Fatalf("after the refused update ServicePort 1 is served from %v, want its old range; ServicePort 0 served %v", got, servesLB(s, 0))
	}
	apply(fencedLB(2, "10.5.0.0/16", "10.6.0.0/16"))
	if _, ok := p.Refused()[localLB(2).Name]; !ok || servesLB(served(), 2) {
		t.Fatalf("a new ServicePort that overfills %s: refused %v, served %v", set, p.Refused(), servesLB(served(), 2))
	}
	// Room made: both refused ones are tried again, in name order.
	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{localLB(0).Name: nil}); err != nil {
		t.Fatal(err)
	}
	expectRefusedAlone(t, p, localLB(2).Name, set)
	if got := served()[lb1].SourceRanges; len(got) != 3 {
		t.Fatalf("once room was made ServicePort 1 is served from %v, want its 3 ranges", got)
	}
}
