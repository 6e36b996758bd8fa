package desired

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kpr-io/kpr/dataplane"
)

func withSourceRanges(r ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = r }
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestSourceRanges(t *testing.T) {
	lb := func(mods ...func(*v1.Service)) *v1.Service {
		return service(append([]func(*v1.Service){withType(v1.ServiceTypeLoadBalancer),
			withIngress(ingress("198.51.100.1", nil))}, mods...)...)
	}
	withNodeIP := thisNode
	withNodeIP.PrimaryIPs = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")}
	cases := []struct {
		name     string
		svc      *v1.Service
		node     Node
		want     []netip.Prefix
		problems []string
	}{
		{name: "none", svc: lb()},
		{name: "trimmed, masked, sorted and deduplicated",
			svc:  lb(withSourceRanges(" 10.0.0.0/8", "203.0.113.7/24 ", "10.0.0.0/8", "::ffff:192.0.2.0/120")),
			want: prefixes("10.0.0.0/8", "192.0.2.0/24", "203.0.113.0/24")},
		{name: "an invalid entry is a problem and is skipped",
			svc:      lb(withSourceRanges("10.0.0.0/8", "bogus", "10.1.2.3", "fe80::/10%eth0")),
			want:     prefixes("10.0.0.0/8"),
			problems: []string{`"bogus" is not a valid CIDR`, `"10.1.2.3" is not a valid CIDR`, `"fe80::/10%eth0" is not a valid CIDR`}},
		{name: "a zero-length prefix allows every client",
			svc: lb(withSourceRanges("10.0.0.0/8", "0.0.0.0/0"))},
		{name: "ranges of a family without a load-balancer IP are left out",
			svc:  lb(withSourceRanges("10.0.0.0/8", "2001:db8::/32")),
			want: prefixes("10.0.0.0/8")},
		{name: "no load-balancer IP, nothing to restrict",
			svc: service(withType(v1.ServiceTypeLoadBalancer), withSourceRanges("10.0.0.0/8"))},
		{name: "ranges holding the node IP let the VIP through as a source",
			svc: lb(withSourceRanges("192.168.0.0/16")), node: withNodeIP,
			want: prefixes("192.168.0.0/16", "198.51.100.1/32")},
		{name: "ranges without the node IP do not",
			svc: lb(withSourceRanges("10.0.0.0/8")), node: withNodeIP,
			want: prefixes("10.0.0.0/8")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node := c.node
			if node.Name == "" {
				node = thisNode
			}
			sps, _, problems := Translate(c.svc, []*discoveryv1.EndpointSlice{slice("s1", discoveryv1.AddressTypeIPv4, httpPort, ep("10.1.0.1"))}, node)
			checkProblems(t, problems, c.problems)
			if len(sps) != 1 {
				t.Fatalf("Translate gave %d ports, want 1", len(sps))
			}
			if got := sps[0].SourceRanges; !slices.Equal(got, c.want) {
				t.Errorf("SourceRanges = %v, want %v", got, c.want)
			}
			// Only the load-balancer frontend is restricted.
			for _, fe := range sps[0].Frontends {
				got := sps[0].SourceRangesFor(fe)
				if fe.Kind != dataplane.LoadBalancer && got != nil {
					t.Errorf("%s frontend %s restricted to %v; only LoadBalancer frontends are", fe.Kind, fe.AddrPort(), got)
				}
				if fe.Kind == dataplane.LoadBalancer && !slices.Equal(got, c.want) {
					t.Errorf("LoadBalancer frontend restricted to %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestEqualSeesSourceRanges(t *testing.T) {
	a := &dataplane.ServicePort{SourceRanges: prefixes("10.0.0.0/8")}
	b := &dataplane.ServicePort{SourceRanges: prefixes("10.0.0.0/16")}
	if Equal(a, b) {
		t.Error("Equal ignores a change of SourceRanges")
	}
}
