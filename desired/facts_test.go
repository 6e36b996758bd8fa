package desired

import (
	"net/netip"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestPortFacts(t *testing.T) {
	v4 := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{slice("s4", discoveryv1.AddressTypeIPv4, httpPort, eps...)}
	}
	nodePort := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports = []v1.ServicePort{svcPort("http", v1.ProtocolTCP, 80, 30080)}
	}
	elsewhere, here := onNode("node-b"), onNode("node-a")
	all := PortFacts{HasEndpoints: true, HasInternalEndpoints: true, HasExternalEndpoints: true}
	cases := []struct {
		name   string
		svc    *v1.Service
		slices []*discoveryv1.EndpointSlice
		want   []PortFacts
	}{
		{name: "Cluster policies, endpoint on another node", svc: service(nodePort), slices: v4(ep("10.1.0.1", elsewhere)), want: []PortFacts{all}},
		{name: "no endpoints anywhere: rejected, not a missing local endpoint", svc: service(nodePort, internalLocal, externalLocal),
			want: []PortFacts{{}}},
		{name: "no usable endpoint: not ready and not serving", svc: service(internalLocal),
			slices: v4(ep("10.1.0.1", elsewhere, notReady), ep("10.1.0.2", elsewhere, terminating(false))), want: []PortFacts{{}}},

		{name: "internal Local, endpoints on other nodes only", svc: service(internalLocal), slices: v4(ep("10.1.0.1", elsewhere)),
			want: []PortFacts{{HasEndpoints: true, HasExternalEndpoints: true}}},
		{name: "internal Local, only a serving terminating endpoint elsewhere", svc: service(internalLocal),
			slices: v4(ep("10.1.0.1", elsewhere, terminating(true))), want: []PortFacts{{HasEndpoints: true, HasExternalEndpoints: true}}},
		{name: "internal Local, endpoint here", svc: service(internalLocal), slices: v4(ep("10.1.0.1", elsewhere), ep("10.1.0.2", here)),
			want: []PortFacts{withLocalReady(all, "10.1.0.2")}},
		{name: "internal Local, topology hints for another zone", svc: service(internalLocal),
			slices: v4(ep("10.1.0.1", elsewhere, forZones("zone-b"))), want: []PortFacts{{HasEndpoints: true, HasExternalEndpoints: true}}},

		{name: "external Local, endpoints on other nodes only", svc: service(nodePort, externalLocal), slices: v4(ep("10.1.0.1", elsewhere)),
			want: []PortFacts{{HasEndpoints: true, HasInternalEndpoints: true}}},
		{name: "external Local, endpoint here", svc: service(nodePort, externalLocal), slices: v4(ep("10.1.0.1", here)),
			want: []PortFacts{withLocalReady(all, "10.1.0.1")}},
		// It still takes outside traffic, but the node is not healthy
		// for a load balancer: it has no ready endpoint.
		{name: "external Local, only a serving terminating endpoint here", svc: service(nodePort, externalLocal),
			slices: v4(ep("10.1.0.1", here, terminating(true)), ep("10.1.0.2", elsewhere)), want: []PortFacts{all}},
		{name: "external Local on a ClusterIP Service means nothing", svc: service(externalLocal), slices: v4(ep("10.1.0.1", elsewhere)),
			want: []PortFacts{all}},
		{name: "external Local without external frontends: nothing dropped",
			svc: service(externalLocal, func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer // no node port, no ingress yet
			}), slices: v4(ep("10.1.0.1", elsewhere)), want: []PortFacts{all}},

		{name: "dual-stack, a local endpoint in IPv4 only",
			svc: service(nodePort, dualStack, internalLocal, externalLocal),
			slices: []*discoveryv1.EndpointSlice{
				slice("s4", discoveryv1.AddressTypeIPv4, httpPort, ep("10.1.0.1", here)),
				slice("s6", discoveryv1.AddressTypeIPv6, httpPort, ep("fd00:1::1", elsewhere)),
			},
			// Cluster-IP traffic has a backend in one family; the IPv6
			// NodePorts drop outside traffic.
			want: []PortFacts{withLocalReady(PortFacts{HasEndpoints: true, HasInternalEndpoints: true}, "10.1.0.1")}},

		{name: "facts follow their ports into name order",
			svc: service(internalLocal, withPorts(svcPort("b", v1.ProtocolTCP, 81, 0), svcPort("a", v1.ProtocolTCP, 80, 0))),
			slices: []*discoveryv1.EndpointSlice{slice("s4", discoveryv1.AddressTypeIPv4,
				ports(eport("a", v1.ProtocolTCP, 8080)), ep("10.1.0.1", elsewhere))},
			want: []PortFacts{{HasEndpoints: true, HasExternalEndpoints: true}, {}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, facts, _ := Translate(c.svc, c.slices, thisNode)
			if len(facts) != len(got) {
				t.Fatalf("%d facts for %d ports", len(facts), len(got))
			}
			if !reflect.DeepEqual(facts, c.want) {
				t.Errorf("facts = %+v, want %+v\nports:\n%v", facts, c.want, render(got))
			}
		})
	}
}

func withLocalReady(f PortFacts, addrs ...string) PortFacts {
	for _, a := range addrs {
		f.LocalReady = append(f.LocalReady, netip.MustParseAddr(a))
	}
	return f
}
