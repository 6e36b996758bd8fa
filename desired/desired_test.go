package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestSkipService(t *testing.T) {
	cases := []struct {
		name   string
		svc    *v1.Service
		skip   bool
		reason string
	}{
		{name: "nil", svc: nil, skip: true, reason: "nil"},
		{name: "plain ClusterIP", svc: service()},
		{name: "NodePort", svc: service(withType(v1.ServiceTypeNodePort))},
		{name: "LoadBalancer", svc: service(withType(v1.ServiceTypeLoadBalancer))},
		{name: "service-proxy-name label", skip: true, reason: "another proxy", svc: service(func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: "cilium"}
		})},
		{name: "service-proxy-name label with empty value", skip: true, reason: "another proxy", svc: service(func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: ""}
		})},
		{name: "headless", skip: true, reason: "headless", svc: service(func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		})},
		{name: "empty clusterIP", skip: true, reason: "no clusterIP", svc: service(func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		})},
		{name: "ExternalName", skip: true, reason: "ExternalName", svc: service(withType(v1.ServiceTypeExternalName))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			skip, reason := SkipService(c.svc)
			if skip != c.skip || !strings.Contains(reason, c.reason) {
				t.Errorf("SkipService = %v, %q; want %v and a reason containing %q", skip, reason, c.skip, c.reason)
			}
			if skip {
				got, facts, problems := Translate(c.svc, []*discoveryv1.EndpointSlice{slice("s1", discoveryv1.AddressTypeIPv4, httpPort, ep("10.1.0.1"))}, thisNode)
				if got != nil || facts != nil || problems != nil {
					t.Errorf("Translate of a skipped Service = %v, %v, %v; want nothing", render(got), facts, problems)
				}
			}
		})
	}
}

func TestSkipSlice(t *testing.T) {
	withLabels := func(labels map[string]string) *discoveryv1.EndpointSlice {
		s := slice("s1", discoveryv1.AddressTypeIPv4, httpPort)
		s.Labels = labels
		return s
	}
	cases := []struct {
		name   string
		slice  *discoveryv1.EndpointSlice
		skip   bool
		reason string
	}{
		{name: "nil", skip: true, reason: "nil"},
		{name: "IPv4", slice: slice("s1", discoveryv1.AddressTypeIPv4, httpPort)},
		{name: "IPv6", slice: slice("s1", discoveryv1.AddressTypeIPv6, httpPort)},
		{name: "FQDN", slice: slice("s1", discoveryv1.AddressTypeFQDN, httpPort), skip: true, reason: "FQDN"},
		{name: "unknown address type", slice: slice("s1", "IPX", httpPort), skip: true, reason: "unknown addressType"},
		{name: "headless label", skip: true, reason: "headless", slice: withLabels(map[string]string{
			discoveryv1.LabelServiceName: "web", v1.IsHeadlessService: "",
		})},
		{name: "no service-name label", slice: withLabels(nil), skip: true, reason: discoveryv1.LabelServiceName},
		{name: "empty service-name label", skip: true, reason: discoveryv1.LabelServiceName, slice: withLabels(map[string]string{
			discoveryv1.LabelServiceName: "",
		})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			skip, reason := SkipSlice(c.slice)
			if skip != c.skip || !strings.Contains(reason, c.reason) {
				t.Errorf("SkipSlice = %v, %q; want %v and a reason containing %q", skip, reason, c.skip, c.reason)
			}
		})
	}
}

func TestSliceServiceName(t *testing.T) {
	key, ok := SliceServiceName(slice("web-abcde", discoveryv1.AddressTypeIPv4, nil))
	if want := (types.NamespacedName{Namespace: "ns", Name: "web"}); !ok || key != want {
		t.Errorf("ServiceKey = %v, %v; want %v, true", key, ok, want)
	}
	if _, ok := SliceServiceName(nil); ok {
		t.Error("SliceServiceName(nil) reported ok")
	}
	unlabelled := slice("x", discoveryv1.AddressTypeIPv4, nil)
	unlabelled.Labels = nil
	if _, ok := SliceServiceName(unlabelled); ok {
		t.Error("ServiceKey of a slice without service-name label reported ok")
	}
}

type translateCase struct {
	name     string
	svc      *v1.Service
	slices   []*discoveryv1.EndpointSlice
	node     *Node // thisNode when nil
	want     []string
	problems []string
}

func runTranslateCases(t *testing.T, cases []translateCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node := thisNode
			if c.node != nil {
				node = *c.node
			}
			got, _, problems := Translate(c.svc, c.slices, node)
			if g := render(got); !slices.Equal(g, c.want) {
				t.Errorf("Translate:\n got:\n%s\nwant:\n%s", strings.Join(g, "\n"), strings.Join(c.want, "\n"))
			}
			checkProblems(t, problems, c.problems)

			// Every table case is also a determinism check: the same
			// input, with the slices in reverse order, gives equal output.
			rev := slices.Clone(c.slices)
			slices.Reverse(rev)
			again, _, _ := Translate(c.svc, rev, node)
			if len(again) != len(got) {
				t.Fatalf("second Translate gave %d ports, first %d", len(again), len(got))
			}
			for i := range got {
				if !Equal(&got[i], &again[i]) {
					t.Errorf("Translate is not deterministic:\n%s\nvs\n%s", render(got[i:i+1]), render(again[i:i+1]))
				}
			}
		})
	}
}

const (
	v4 = discoveryv1.AddressTypeIPv4
	v6 = discoveryv1.AddressTypeIPv6
)

func TestTranslatePortsAndEndpoints(t *testing.T) {
	runTranslateCases(t, []translateCase{
		{
			name:   "ClusterIP with sorted backends from the slice's resolved port",
			svc:    service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, ep("10.1.0.2"), ep("10.1.0.1"))},
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]",
			},
		},
		{
			name:   "no slices: frontend with an empty set rejects",
			svc:    service(),
			slices: nil,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> []"},
		},
		{
			name: "multiport: each Service port takes the slice port of its name and protocol",
			svc: service(withPorts(
				svcPort("http", v1.ProtocolTCP, 80, 0),
				svcPort("dns", v1.ProtocolUDP, 53, 0),
				svcPort("dns", v1.ProtocolTCP, 53, 0),
			)),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, ports(
				eport("http", v1.ProtocolTCP, 8080),
				eport("dns", v1.ProtocolUDP, 5353),
				eport("dns", v1.ProtocolTCP, 5354),
				eport("metrics", v1.ProtocolTCP, 9090),
			), ep("10.1.0.1"))},
			want: []string{
				"port ns/web:dns/TCP",
				"  ClusterIP 10.96.0.10:53/TCP -> [10.1.0.1:5354]",
				"port ns/web:dns/UDP",
				"  ClusterIP 10.96.0.10:53/UDP -> [10.1.0.1:5353]",
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
			},
		},
		{
			name: "unnamed single port matches the slice port with the empty name",
			svc:  service(withPorts(svcPort("", v1.ProtocolTCP, 80, 0))),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, ports(
				eport("", v1.ProtocolTCP, 8080),
				eport("", v1.ProtocolUDP, 8081),
			), ep("10.1.0.1"))},
			want: []string{"port ns/web/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "nil slice port protocol means TCP",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, ports(
				discoveryv1.EndpointPort{Name: ptr("http"), Port: ptr(int32(8080))},
			), ep("10.1.0.1"))},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "slices are merged and duplicate ip:port pairs dropped",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", v4, httpPort, ep("10.1.0.1"), ep("10.1.0.2"), ep("10.1.0.1")),
				slice("s2", v4, httpPort, ep("10.1.0.2"), ep("10.1.0.3")),
				slice("s3", v4, ports(eport("http", v1.ProtocolTCP, 8081)), ep("10.1.0.1")),
			},
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.1:8081 10.1.0.2:8080 10.1.0.3:8080]",
			},
		},
		manyDuplicatesCase(),
		{
			name: "a duplicate that is ready wins over one that is not, whatever the order",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", v4, httpPort, ep("10.1.0.1", notReady)),
				slice("s2", v4, httpPort, ep("10.1.0.1")),
			},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "a duplicate on this node wins (Local policy sees it)",
			svc:  service(internalLocal),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", v4, httpPort, ep("10.1.0.1", onNode("node-b"))),
				slice("s2", v4, httpPort, ep("10.1.0.1", onNode("node-a"))),
			},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "invalid ports and addresses are reported and the rest kept",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", v4, ports(
					eport("http", v1.ProtocolTCP, 0),
					eport("http", v1.ProtocolTCP, 70000),
					eport("http", v1.ProtocolTCP, -1),
					discoveryv1.EndpointPort{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP)},
					discoveryv1.EndpointPort{Port: ptr(int32(8080))},
					eport("http", "QUIC", 8080),
					eport("http", v1.ProtocolTCP, 8080),
				),
					ep("10.1.0.1"),
					ep("not-an-ip"),
					ep("0.0.0.0"),
					ep("fd00::1"),
					ep("fe80::1%eth0"),
					discoveryv1.Endpoint{},
					ep("10.1.0.2"),
				),
			},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]"},
			problems: []string{
				"ns/s1: port \"http\" number 0 is out of range",
				"ns/s1: port \"http\" number 70000 is out of range",
				"ns/s1: port \"http\" number -1 is out of range",
				"ns/s1: port \"http\" has no port number",
				"ns/s1: port with no name",
				"unknown protocol \"QUIC\"",
				"\"not-an-ip\" is not a usable IP",
				"\"0.0.0.0\" is not a usable IP",
				"fd00::1 is not IPv4",
				"\"fe80::1%eth0\" is not a usable IP",
				"endpoint with no address",
			},
		},
		{
			name: "IPv4-mapped IPv6 endpoint address counts as IPv4",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				slice("s1", v4, httpPort, ep("::ffff:10.1.0.1")),
			},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "skipped slices are ignored; another Service's slice is reported",
			svc:  service(),
			slices: func() []*discoveryv1.EndpointSlice {
				headless := slice("s2", v4, httpPort, ep("10.1.0.2"))
				headless.Labels[v1.IsHeadlessService] = ""
				other := slice("s3", v4, httpPort, ep("10.1.0.3"))
				other.Labels[discoveryv1.LabelServiceName] = "api"
				otherNS := slice("s4", v4, httpPort, ep("10.1.0.4"))
				otherNS.Namespace = "prod"
				return []*discoveryv1.EndpointSlice{
					slice("s1", v4, httpPort, ep("10.1.0.1")),
					headless, other, otherNS, nil,
					slice("s5", discoveryv1.AddressTypeFQDN, httpPort, ep("example.com")),
				}
			}(),
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
			problems: []string{
				"ns/s3: belongs to Service ns/api",
				"prod/s4: belongs to Service prod/web",
			},
		},
		{
			name: "SCTP is reported and left out; other ports stay",
			svc: service(withPorts(
				svcPort("http", v1.ProtocolTCP, 80, 0),
				svcPort("sig", v1.ProtocolSCTP, 3868, 0),
			)),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, ports(
				eport("http", v1.ProtocolTCP, 8080), eport("sig", v1.ProtocolSCTP, 3868),
			), ep("10.1.0.1"))},
			want:     []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
			problems: []string{"port \"sig\": SCTP is not supported by kpr"},
		},
		{
			name: "invalid Service ports are reported and left out",
			svc: service(withPorts(
				svcPort("zero", v1.ProtocolTCP, 0, 0),
				svcPort("big", v1.ProtocolTCP, 65536, 0),
				svcPort("odd", "QUIC", 443, 0),
				svcPort("http", "", 80, 0), // empty protocol is the API default TCP
				svcPort("http", v1.ProtocolTCP, 81, 0),
			)),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, ep("10.1.0.1"))},
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
			problems: []string{
				"port \"zero\": service port 0 is out of range",
				"port \"big\": service port 65536 is out of range",
				"port \"odd\": unknown protocol",
				"duplicate port ns/web:http/TCP",
			},
		},
		{
			name: "no usable cluster IP: nothing is programmed",
			svc: service(func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.999", nil
			}),
			slices:   []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, ep("10.1.0.1"))},
			problems: []string{"cluster IP \"10.96.0.999\" is not a valid IP"},
		},
		{
			name: "clusterIP alone (no clusterIPs) is used",
			svc: service(func(s *v1.Service) {
				s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil
			}),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, ep("10.1.0.1"))},
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
	})
}

func TestTranslateFamiliesAndFrontends(t *testing.T) {
	dual := []*discoveryv1.EndpointSlice{
		slice("s4", v4, httpPort, ep("10.1.0.1")),
		slice("s6", v6, httpPort, ep("fd00:1::1")),
	}
	runTranslateCases(t, []translateCase{
		{
			name:   "dual-stack: one ClusterIP frontend per family, backends of its family",
			svc:    service(dualStack),
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  ClusterIP [fd00:96::10]:80/TCP -> [[fd00:1::1]:8080]",
			},
		},
		{
			name:   "single-stack IPv4 ignores IPv6 endpoints",
			svc:    service(),
			slices: dual,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name:   "single-stack IPv6",
			svc:    service(ipv6Only),
			slices: dual,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP [fd00:96::10]:80/TCP -> [[fd00:1::1]:8080]"},
		},
		{
			name: "cluster IP of a family spec.ipFamilies does not list is ignored",
			svc: service(func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10", "10.96.0.11"}
			}),
			slices:   dual,
			want:     []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
			problems: []string{"fd00:96::10 is IPv6, which spec.ipFamilies does not list", "second IPv4 cluster IP 10.96.0.11"},
		},
		{
			name:   "NodePort on node addresses of the Service's family plus 127.0.0.1",
			svc:    service(withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080))),
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080]",
				"  NodePort 192.168.1.10:30080/TCP -> [10.1.0.1:8080]",
			},
		},
		{
			name:   "dual-stack NodePort adds the IPv6 addresses and ::1",
			svc:    service(dualStack, withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080))),
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  ClusterIP [fd00:96::10]:80/TCP -> [[fd00:1::1]:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080]",
				"  NodePort 192.168.1.10:30080/TCP -> [10.1.0.1:8080]",
				"  NodePort [::1]:30080/TCP -> [[fd00:1::1]:8080]",
				"  NodePort [2001:db8::10]:30080/TCP -> [[fd00:1::1]:8080]",
			},
		},
		{
			name: "node addresses that are invalid or loopback duplicates are dropped",
			svc:  service(withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080))),
			node: &Node{Name: "node-a", Addresses: []netip.Addr{
				{}, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::ffff:192.168.1.11"), netip.MustParseAddr("0.0.0.0"),
			}},
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080]",
				"  NodePort 192.168.1.11:30080/TCP -> [10.1.0.1:8080]",
			},
		},
		{
			name:   "a nodePort on a ClusterIP Service is not served",
			svc:    service(withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080))),
			slices: dual,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name:     "an out-of-range nodePort is reported",
			svc:      service(withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 70000))),
			slices:   dual,
			want:     []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
			problems: []string{"nodePort 70000 is out of range"},
		},
		{
			name:   "externalIPs, of the Service's families only",
			svc:    service(withExternalIPs("203.0.113.7", "2001:db8::7", "bogus")),
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  ExternalIP 203.0.113.7:80/TCP -> [10.1.0.1:8080]",
			},
			problems: []string{"ExternalIP address 2001:db8::7 is IPv6 but the Service has no IPv6", "ExternalIP address \"bogus\""},
		},
		{
			name: "LoadBalancer: VIP-mode ingress IPs, not Proxy mode; nodePort 0 means none",
			svc: service(withType(v1.ServiceTypeLoadBalancer), withIngress(
				ingress("198.51.100.1", nil),
				ingress("198.51.100.2", ptr(v1.LoadBalancerIPModeVIP)),
				ingress("198.51.100.3", ptr(v1.LoadBalancerIPModeProxy)),
				ingress("198.51.100.4", ptr(v1.LoadBalancerIPMode("Teleport"))),
				v1.LoadBalancerIngress{Hostname: "lb.example.com"},
			)),
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  LoadBalancer 198.51.100.1:80/TCP -> [10.1.0.1:8080]",
				"  LoadBalancer 198.51.100.2:80/TCP -> [10.1.0.1:8080]",
			},
			problems: []string{"198.51.100.4 has unknown ipMode \"Teleport\""},
		},
		{
			name: "LoadBalancer with a nodePort serves it too",
			svc: service(withType(v1.ServiceTypeLoadBalancer), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080)),
				withIngress(ingress("198.51.100.1", nil))),
			node:   &Node{Name: "node-a", Addresses: loopbackOnly},
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080]",
				"  LoadBalancer 198.51.100.1:80/TCP -> [10.1.0.1:8080]",
			},
		},
		{
			name:   "an address used twice is programmed once, as the first kind",
			svc:    service(withType(v1.ServiceTypeLoadBalancer), withExternalIPs("198.51.100.1"), withIngress(ingress("198.51.100.1", nil))),
			slices: dual,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  ExternalIP 198.51.100.1:80/TCP -> [10.1.0.1:8080]",
			},
			problems: []string{"LoadBalancer frontend 198.51.100.1:80 is already the ExternalIP frontend"},
		},
	})
}

func TestTranslateConditions(t *testing.T) {
	runTranslateCases(t, []translateCase{
		{
			name: "only ready endpoints; missing conditions mean ready",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1"),
				ep("10.1.0.2", notReady),
				ep("10.1.0.3", terminating(true)),
				ep("10.1.0.4", func(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr(true) }),
			)},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.4:8080]"},
		},
		{
			name: "no ready endpoint anywhere: fall back to serving and terminating ones",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1", terminating(true)),
				ep("10.1.0.2", notReady),
				ep("10.1.0.3", terminating(false)),
				ep("10.1.0.4", terminating(true)),
				// serving but not terminating: a pod failing readiness, not a fallback
				ep("10.1.0.5", func(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr(false); e.Conditions.Serving = ptr(true) }),
			)},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.4:8080]"},
		},
		{
			name: "nothing ready or serving: empty set",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.2", notReady), ep("10.1.0.3", terminating(false)),
			)},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> []"},
		},
		{
			name: "publishNotReadyAddresses makes every endpoint count as ready",
			svc:  service(func(s *v1.Service) { s.Spec.PublishNotReadyAddresses = true }),
			slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
				ep("10.1.0.1"), ep("10.1.0.2", notReady), ep("10.1.0.3", terminating(false)),
			)},
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080 10.1.0.3:8080]"},
		},
		{
			name: "fallback is decided per family",
			svc:  service(dualStack),
			slices: []*discoveryv1.EndpointSlice{
				slice("s4", v4, httpPort, ep("10.1.0.1"), ep("10.1.0.2", terminating(true))),
				slice("s6", v6, httpPort, ep("fd00:1::1", notReady), ep("fd00:1::2", terminating(true))),
			},
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  ClusterIP [fd00:96::10]:80/TCP -> [[fd00:1::2]:8080]",
			},
		},
	})
}

func TestTranslateTrafficPolicies(t *testing.T) {
	np := withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080))
	node := &Node{Name: "node-a", Addresses: loopbackOnly} // only loopback NodePorts, to keep the tables short
	mixed := []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
		ep("10.1.0.1", onNode("node-a")),
		ep("10.1.0.2", onNode("node-b")),
		ep("10.1.0.3", onNode("node-a"), terminating(true)),
	)}
	localTerminating := []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
		ep("10.1.0.1", onNode("node-a"), terminating(true)),
		ep("10.1.0.2", onNode("node-b")),
		ep("10.1.0.3", onNode("node-a"), terminating(false)),
	)}
	remoteOnly := []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort,
		ep("10.1.0.2", onNode("node-b")), ep("10.1.0.4"),
	)}
	runTranslateCases(t, []translateCase{
		{
			name:   "internalTrafficPolicy Local: ClusterIP gets this node's ready endpoints",
			svc:    service(internalLocal),
			slices: mixed,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name:   "internalTrafficPolicy Local falls back to local serving+terminating",
			svc:    service(internalLocal),
			slices: localTerminating,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name:   "internalTrafficPolicy Local without local endpoints drops",
			svc:    service(internalLocal),
			slices: remoteOnly,
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> []"},
		},
		{
			name:   "internalTrafficPolicy Local with an unnamed node has no local endpoints",
			svc:    service(internalLocal),
			slices: mixed,
			node:   &Node{Addresses: loopbackOnly},
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> []"},
		},
		{
			name:   "internalTrafficPolicy Local leaves external frontends cluster-wide",
			svc:    service(internalLocal, withType(v1.ServiceTypeNodePort), np),
			slices: mixed,
			node:   node,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080 10.1.0.2:8080]",
			},
		},
		{
			name:   "externalTrafficPolicy Local: external frontends keep outside traffic local",
			svc:    service(externalLocal, withType(v1.ServiceTypeLoadBalancer), np, withExternalIPs("203.0.113.7"), withIngress(ingress("198.51.100.1", nil))),
			slices: mixed,
			node:   node,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080 10.1.0.2:8080] ext=[10.1.0.1:8080]",
				"  ExternalIP 203.0.113.7:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080] ext=[10.1.0.1:8080]",
				"  LoadBalancer 198.51.100.1:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080] ext=[10.1.0.1:8080]",
			},
		},
		{
			name:   "externalTrafficPolicy Local falls back to local serving+terminating",
			svc:    service(externalLocal, withType(v1.ServiceTypeNodePort), np),
			slices: localTerminating,
			node:   node,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.2:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.2:8080] ext=[10.1.0.1:8080]",
			},
		},
		{
			name:   "externalTrafficPolicy Local without local endpoints: empty non-nil set drops",
			svc:    service(externalLocal, withType(v1.ServiceTypeNodePort), np),
			slices: remoteOnly,
			node:   node,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.2:8080 10.1.0.4:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.2:8080 10.1.0.4:8080] ext=[]",
			},
		},
		{
			name:   "externalTrafficPolicy Local means nothing on a ClusterIP Service",
			svc:    service(externalLocal, withExternalIPs("203.0.113.7")),
			slices: mixed,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]",
				"  ExternalIP 203.0.113.7:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]",
			},
		},
		{
			name:   "both policies Local",
			svc:    service(externalLocal, internalLocal, withType(v1.ServiceTypeNodePort), np),
			slices: mixed,
			node:   node,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080 10.1.0.2:8080] ext=[10.1.0.1:8080]",
			},
		},
	})
}

func TestTranslateTopology(t *testing.T) {
	zoned := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, eps...)}
	}
	runTranslateCases(t, []translateCase{
		{
			name: "zone hints: every ready endpoint hinted, one for our zone",
			svc:  service(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose) }),
			slices: zoned(
				ep("10.1.0.1", forZones("zone-a")),
				ep("10.1.0.2", forZones("zone-b")),
				ep("10.1.0.3", forZones("zone-b", "zone-a")),
				ep("10.1.0.4", notReady), // not ready: its missing hint does not matter
			),
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.3:8080]"},
		},
		{
			name:   "zone hints: one ready endpoint without a hint disables the filter",
			svc:    service(),
			slices: zoned(ep("10.1.0.1", forZones("zone-a")), ep("10.1.0.2")),
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]"},
		},
		{
			name:   "zone hints: none for our zone disables the filter",
			svc:    service(),
			slices: zoned(ep("10.1.0.1", forZones("zone-b")), ep("10.1.0.2", forZones("zone-c"))),
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]"},
		},
		{
			name:   "zone hints: a node without a zone label uses no filter, even with empty-named hints",
			svc:    service(),
			node:   &Node{Name: "node-a", Addresses: loopbackOnly},
			slices: zoned(ep("10.1.0.1", forZones("")), ep("10.1.0.2", forZones("zone-b"))),
			want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]"},
		},
		{
			name: "node hints: every ready endpoint hinted, one for this node",
			svc:  service(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameNode) }),
			slices: zoned(
				ep("10.1.0.1", forNodes("node-a"), forZones("zone-a")),
				ep("10.1.0.2", forNodes("node-b"), forZones("zone-a")),
			),
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "node hints not for this node fall through to zone hints",
			svc:  service(),
			slices: zoned(
				ep("10.1.0.1", forNodes("node-b"), forZones("zone-a")),
				ep("10.1.0.2", forNodes("node-c"), forZones("zone-b")),
			),
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"},
		},
		{
			name: "node hints missing on one endpoint fall through to zone hints",
			svc:  service(),
			slices: zoned(
				ep("10.1.0.1", forNodes("node-a"), forZones("zone-b")),
				ep("10.1.0.2", forZones("zone-a")),
			),
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.2:8080]"},
		},
		{
			name: "topology is ignored by the serving+terminating fallback",
			svc:  service(),
			slices: zoned(
				ep("10.1.0.1", forZones("zone-a"), terminating(true)),
				ep("10.1.0.2", forZones("zone-b"), terminating(true)),
			),
			want: []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080 10.1.0.2:8080]"},
		},
		{
			name: "topology filters the cluster set of external frontends but not the local set",
			svc:  service(externalLocal, withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080))),
			node: &Node{Name: "node-a", Zone: "zone-a", Addresses: loopbackOnly},
			slices: zoned(
				ep("10.1.0.1", onNode("node-a"), forZones("zone-b")),
				ep("10.1.0.2", onNode("node-b"), forZones("zone-a")),
			),
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.2:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.2:8080] ext=[10.1.0.1:8080]",
			},
		},
	})
}

func TestTranslateAffinity(t *testing.T) {
	s := []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, ep("10.1.0.1"))}
	fe := "  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]"
	runTranslateCases(t, []translateCase{
		{
			name:   "ClientIP with the default timeout",
			svc:    service(withAffinity(nil)),
			slices: s,
			want:   []string{"port ns/web:http/TCP affinity=3h0m0s", fe},
		},
		{
			name:   "ClientIP with a timeout",
			svc:    service(withAffinity(ptr(int32(60)))),
			slices: s,
			want:   []string{"port ns/web:http/TCP affinity=1m0s", fe},
		},
		{
			name:     "ClientIP with a non-positive timeout uses the default",
			svc:      service(withAffinity(ptr(int32(0)))),
			slices:   s,
			want:     []string{"port ns/web:http/TCP affinity=3h0m0s", fe},
			problems: []string{"timeoutSeconds 0 is not positive"},
		},
		{
			name: "affinity None ignores a stale config",
			svc: service(withAffinity(ptr(int32(60))), func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityNone
			}),
			slices: s,
			want:   []string{"port ns/web:http/TCP", fe},
		},
	})
}

// manyDuplicatesCase has more candidate endpoints than endpointsFor
// deduplicates by a scan, so that its index is used: 40 addresses in two
// slices, each in both, ready only in the second.
func manyDuplicatesCase() translateCase {
	var first, second []discoveryv1.Endpoint
	var want []string
	for i := 1; i <= 40; i++ {
		addr := fmt.Sprintf("10.1.0.%d", i)
		first = append(first, ep(addr, notReady))
		second = append(second, ep(addr))
		want = append(want, addr+":8080")
	}
	return translateCase{
		name:   "duplicates among many endpoints are dropped, the ready one kept",
		svc:    service(),
		slices: []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, first...), slice("s2", v4, httpPort, second...)},
		want:   []string{"port ns/web:http/TCP", "  ClusterIP 10.96.0.10:80/TCP -> [" + strings.Join(want, " ") + "]"},
	}
}

// The healthCheckNodePort rides along only where kpr's health server
// serves it: under externalTrafficPolicy Local.
func TestTranslateHealthCheckNodePort(t *testing.T) {
	s := []*discoveryv1.EndpointSlice{slice("s1", v4, httpPort, ep("10.1.0.1", onNode("node-a")))}
	node := &Node{Name: "node-a", Addresses: loopbackOnly}
	withHealthCheck := func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }
	nodePort := []func(*v1.Service){withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30080)), withHealthCheck}
	runTranslateCases(t, []translateCase{
		{
			name:   "externalTrafficPolicy Local",
			svc:    service(append([]func(*v1.Service){externalLocal}, nodePort...)...),
			node:   node,
			slices: s,
			want: []string{
				"port ns/web:http/TCP healthCheckNodePort=32000",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080] ext=[10.1.0.1:8080]",
			},
		},
		{
			name:   "a stale healthCheckNodePort under Cluster",
			svc:    service(nodePort...),
			node:   node,
			slices: s,
			want: []string{
				"port ns/web:http/TCP",
				"  ClusterIP 10.96.0.10:80/TCP -> [10.1.0.1:8080]",
				"  NodePort 127.0.0.1:30080/TCP -> [10.1.0.1:8080]",
			},
		},
	})
}
