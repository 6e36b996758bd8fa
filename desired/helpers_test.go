package desired

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/dataplane"
)

// Builders for test objects. The default Service is ns/web, single-stack
// IPv4, ClusterIP 10.96.0.10, one TCP port "http" 80 -> named targetPort.

func service(mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{svcPort("http", v1.ProtocolTCP, 80, 0)},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func svcPort(name string, proto v1.Protocol, port, nodePort int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort}
}

func withPorts(ps ...v1.ServicePort) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Ports = ps }
}

func withType(t v1.ServiceType) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Type = t }
}

func dualStack(s *v1.Service) {
	s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
	s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
}

func ipv6Only(s *v1.Service) {
	s.Spec.ClusterIP = "fd00:96::10"
	s.Spec.ClusterIPs = []string{"fd00:96::10"}
	s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
}

func withExternalIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

func withIngress(ing ...v1.LoadBalancerIngress) func(*v1.Service) {
	return func(s *v1.Service) { s.Status.LoadBalancer.Ingress = ing }
}

func ingress(ip string, mode *v1.LoadBalancerIPMode) v1.LoadBalancerIngress {
	return v1.LoadBalancerIngress{IP: ip, IPMode: mode}
}

func externalLocal(s *v1.Service) {
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
}

func internalLocal(s *v1.Service) {
	p := v1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &p
}

func withAffinity(timeout *int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if timeout != nil {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: timeout}}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// slice builds an EndpointSlice of ns/web.
func slice(name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

func eport(name string, proto v1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(port)}
}

// httpPort is the slice port that the default Service port "http" resolves to.
var httpPort = ports(eport("http", v1.ProtocolTCP, 8080))

type epMod func(*discoveryv1.Endpoint)

func ep(addr string, mods ...epMod) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, m := range mods {
		m(&e)
	}
	return e
}

func notReady(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr(false) }

// terminating marks the endpoint terminating (not ready), serving or not.
func terminating(serving bool) epMod {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions.Ready = ptr(false)
		e.Conditions.Serving = ptr(serving)
		e.Conditions.Terminating = ptr(true)
	}
}

func onNode(n string) epMod { return func(e *discoveryv1.Endpoint) { e.NodeName = ptr(n) } }

func forZones(zs ...string) epMod {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zs {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func forNodes(ns ...string) epMod {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range ns {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// thisNode is the node the tests translate for, with NodePorts on its
// addresses and loopback as the default --nodeport-addresses selects them.
var thisNode = Node{
	Name:      "node-a",
	Zone:      "zone-a",
	Addresses: []netip.Addr{loopback6, loopback4, netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")},
}

// loopbackOnly is what the default --nodeport-addresses selects before the
// Node object is known.
var loopbackOnly = []netip.Addr{loopback6, loopback4}

// render prints translated ports compactly, one line per port and per
// frontend, so expectations in tables stay readable. ExternalBackends is
// shown only when non-nil, so "ext=[]" is the empty non-nil set.
func render(sps []dataplane.ServicePort) []string {
	var out []string
	for _, sp := range sps {
		line := "port " + sp.Name.String()
		if sp.AffinityTimeout != 0 {
			line += " affinity=" + sp.AffinityTimeout.String()
		}
		if sp.HealthCheckNodePort != 0 {
			line += fmt.Sprintf(" healthCheckNodePort=%d", sp.HealthCheckNodePort)
		}
		out = append(out, line)
		for _, f := range sp.Frontends {
			l := fmt.Sprintf("  %s %s/%s -> %v", f.Kind, f.AddrPort(), f.Protocol, f.Backends)
			if f.ExternalBackends != nil {
				l += fmt.Sprintf(" ext=%v", f.ExternalBackends)
			}
			out = append(out, l)
		}
	}
	return out
}

// checkProblems fails unless every problem matches exactly one expected
// substring, in any order.
func checkProblems(t *testing.T, got []Problem, want []string) {
	t.Helper()
	unmatched := append([]string(nil), want...)
outer:
	for _, p := range got {
		for i, w := range unmatched {
			if strings.Contains(p.String(), w) {
				unmatched = append(unmatched[:i], unmatched[i+1:]...)
				continue outer
			}
		}
		t.Errorf("unexpected problem: %s", p)
	}
	for _, w := range unmatched {
		t.Errorf("missing problem containing %q", w)
	}
}
