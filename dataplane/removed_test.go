package dataplane

import (
	"net/netip"
	"reflect"
	"sort"
	"testing"
)

func udp(vip string, backends ...string) Frontend {
	f := Frontend{Addr: netip.MustParseAddr(vip), Port: 53, Protocol: UDP, Kind: ClusterIP}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		f.Backends = append(f.Backends, Backend{Addr: ap.Addr(), Port: ap.Port()})
	}
	return f
}

func removedStrings(rs []RemovedBackend) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Frontend.String()+"->"+r.Backend.String())
	}
	sort.Strings(out)
	return out
}

func TestRemovedUDPBackends(t *testing.T) {
	tcp := udp("10.96.0.11", "10.244.0.1:53")
	tcp.Protocol = TCP
	withExternal := udp("10.96.0.10", "10.244.0.1:53", "10.244.0.2:53")
	withExternal.ExternalBackends = []Backend{{Addr: netip.MustParseAddr("10.244.0.1"), Port: 53}}
	cases := []struct {
		name      string
		old, next *ServicePort
		want      []string
	}{
		{"a new ServicePort removes nothing", nil, sp(udp("10.96.0.10", "10.244.0.1:53")), []string{}},
		{"a backend replaced, one kept, the same backend in two slots",
			sp(udp("10.96.0.10", "10.244.0.1:53", "10.244.0.2:53", "10.244.0.1:53")),
			sp(udp("10.96.0.10", "10.244.0.2:53", "10.244.0.3:53")),
			[]string{"10.96.0.10:53->10.244.0.1:53"}},
		{"TCP does not count", sp(tcp), sp(), []string{}},
		{"only the backend set of traffic from inside counts",
			sp(withExternal), sp(udp("10.96.0.10", "10.244.0.1:53", "10.244.0.2:53")), []string{}},
		{"a dropped frontend removes its backends",
			sp(udp("10.96.0.10", "10.244.0.1:53"), udp("192.0.2.1", "10.244.0.1:53")),
			sp(udp("10.96.0.10", "10.244.0.1:53")),
			[]string{"192.0.2.1:53->10.244.0.1:53"}},
		{"a deleted ServicePort removes all its backends once each",
			sp(udp("10.96.0.10", "10.244.0.2:53", "[::ffff:10.244.0.3]:53", "10.244.0.3:53")), nil,
			[]string{"10.96.0.10:53->10.244.0.2:53", "10.96.0.10:53->10.244.0.3:53"}},
	}
	for _, c := range cases {
		if got := removedStrings(RemovedUDPBackends(c.old, c.next)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: removed %v, want %v", c.name, got, c.want)
		}
	}
}
