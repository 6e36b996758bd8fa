package desired

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// apiNode is a dual-stack Node object with two InternalIPs and one
// ExternalIP per family, plus a hostname that is not an IP.
func apiNode() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeHostName, Address: "node-a"},
			{Type: v1.NodeExternalIP, Address: "203.0.113.7"},
			{Type: v1.NodeInternalIP, Address: "192.168.1.10"},
			{Type: v1.NodeInternalIP, Address: "2001:db8::10"},
			{Type: v1.NodeInternalIP, Address: "192.168.2.10"},
			{Type: v1.NodeExternalIP, Address: "2001:db8:ffff::7"},
		}},
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func TestNodePortAddressesSelect(t *testing.T) {
	all := addrs("127.0.0.1", "::1", "192.168.1.10", "192.168.2.10", "203.0.113.7", "2001:db8::10", "2001:db8:ffff::7")
	for _, tc := range []struct {
		name  string
		flag  []string
		node  *v1.Node
		want  []netip.Addr
		error string
	}{
		{name: "empty means all, loopback included", want: all},
		{name: "all", flag: []string{"all"}, want: all},
		{name: "empty before the Node is known: loopback only", node: nil, want: addrs("127.0.0.1", "::1")},
		{name: "a CIDR leaves loopback out", flag: []string{"192.168.0.0/16"}, want: addrs("192.168.1.10", "192.168.2.10")},
		{name: "a CIDR of one family serves nothing of the other", flag: []string{"2001:db8::/64"}, want: addrs("2001:db8::10")},
		{name: "localhost alone", flag: []string{"localhost"}, want: addrs("127.0.0.1", "::1")},
		{name: "a loopback CIDR", flag: []string{"127.0.0.1/32"}, want: addrs("127.0.0.1")},
		{name: "primary: the first InternalIP of each family", flag: []string{"primary"}, want: addrs("192.168.1.10", "2001:db8::10")},
		{name: "primary before the Node is known: nothing", flag: []string{"primary"}, node: nil, want: nil},
		{name: "primary and localhost", flag: []string{"primary", " localhost"}, want: addrs("127.0.0.1", "::1", "192.168.1.10", "2001:db8::10")},
		{name: "primary and a CIDR", flag: []string{"primary", "203.0.113.0/24"}, want: addrs("192.168.1.10", "2001:db8::10", "203.0.113.7")},
		{name: "not a CIDR", flag: []string{"192.168.1.10"}, error: "neither a CIDR"},
		{name: "unknown keyword", flag: []string{"primaryip"}, error: "neither a CIDR"},
		{name: "keyword twice", flag: []string{"primary", "primary"}, error: "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			npa, err := ParseNodePortAddresses(tc.flag)
			if tc.error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("ParseNodePortAddresses(%q) = %v, want an error containing %q", tc.flag, err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			node := apiNode()
			if strings.Contains(tc.name, "before the Node is known") {
				node = tc.node
			}
			if got := npa.Select(node); !slices.Equal(got, tc.want) {
				t.Errorf("Select = %v, want %v", got, tc.want)
			}
		})
	}
}

// localhostNodePorts: false leaves loopback out whatever the list says.
func TestNodePortAddressesWithoutLoopback(t *testing.T) {
	for _, flag := range [][]string{nil, {"all"}, {"localhost"}, {"127.0.0.1/32", "primary"}} {
		npa, err := ParseNodePortAddresses(flag)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range npa.WithoutLoopback().Select(apiNode(), netip.MustParseAddr("127.0.0.53")) {
			if a.IsLoopback() {
				t.Errorf("%q without loopback selects %s", flag, a)
			}
		}
	}
}

func TestPrimaryIPsFallBackToExternalIP(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeExternalIP, Address: "203.0.113.7"},
		{Type: v1.NodeExternalIP, Address: "203.0.113.8"},
	}}}
	if got, want := PrimaryIPs(node), addrs("203.0.113.7"); !slices.Equal(got, want) {
		t.Errorf("PrimaryIPs = %v, want %v", got, want)
	}
	// An IPv6 InternalIP comes first; the IPv4 one is the other family's.
	node.Status.Addresses = append(node.Status.Addresses,
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "2001:db8::10"})
	if got, want := PrimaryIPs(node), []netip.Addr{netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("203.0.113.7")}; !slices.Equal(got, want) {
		t.Errorf("PrimaryIPs = %v, want %v", got, want)
	}
}

func TestNewNode(t *testing.T) {
	npa, err := ParseNodePortAddresses([]string{"primary"})
	if err != nil {
		t.Fatal(err)
	}
	n := NewNode("node-a", apiNode(), NodeConfig{NodePortAddresses: npa, ExternalIPs: ExternalIPsNodeLocal})
	if n.Zone != "zone-a" || len(n.Addresses) != 2 || len(n.IPs) != 5 || n.ExternalIPs != ExternalIPsNodeLocal {
		t.Fatalf("NewNode = %+v", n)
	}
	other := n
	other.ExternalIPs = ExternalIPsAll
	if n.Equal(other) || !n.Equal(NewNode("node-a", apiNode(), NodeConfig{NodePortAddresses: npa, ExternalIPs: ExternalIPsNodeLocal})) {
		t.Error("Equal must tell the ExternalIPs policy apart and nothing else here")
	}
}

func TestParseExternalIPPolicy(t *testing.T) {
	for _, p := range []ExternalIPPolicy{ExternalIPsAll, ExternalIPsNodeLocal, ExternalIPsNone} {
		got, err := ParseExternalIPPolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParseExternalIPPolicy(%q) = %v, %v", p, got, err)
		}
	}
	if _, err := ParseExternalIPPolicy("local"); err == nil {
		t.Error(`ParseExternalIPPolicy("local") accepted`)
	}
}

// CVE-2020-8554: under node-local an ExternalIP that is not this node's
// (8.8.8.8) gets no frontend, so the node's sockets reach the real 8.8.8.8;
// one of the node's own addresses still does.
func TestTranslateExternalIPPolicy(t *testing.T) {
	svc := service(dualStack, withPorts(svcPort("dns", v1.ProtocolUDP, 53, 0)),
		withExternalIPs("8.8.8.8", "203.0.113.7", "2001:db8:ffff::7", "2001:4860:4860::8888", "not-an-ip"))
	eps := []*discoveryv1.EndpointSlice{
		slice("s4", v4, ports(eport("dns", v1.ProtocolUDP, 5353)), ep("10.1.0.1")),
		slice("s6", v6, ports(eport("dns", v1.ProtocolUDP, 5353)), ep("fd00:1::1")),
	}
	clusterIPs := []string{
		"port ns/web:dns/UDP",
		"  ClusterIP 10.96.0.10:53/UDP -> [10.1.0.1:5353]",
		"  ClusterIP [fd00:96::10]:53/UDP -> [[fd00:1::1]:5353]",
	}
	for _, tc := range []struct {
		policy   ExternalIPPolicy
		external []string
		problems []string
	}{
		{ExternalIPsAll, []string{
			"  ExternalIP 8.8.8.8:53/UDP -> [10.1.0.1:5353]",
			"  ExternalIP 203.0.113.7:53/UDP -> [10.1.0.1:5353]",
			"  ExternalIP [2001:db8:ffff::7]:53/UDP -> [[fd00:1::1]:5353]",
			"  ExternalIP [2001:4860:4860::8888]:53/UDP -> [[fd00:1::1]:5353]",
		}, []string{`"not-an-ip" is not a valid IP`}},
		{ExternalIPsNodeLocal, []string{
			"  ExternalIP 203.0.113.7:53/UDP -> [10.1.0.1:5353]",
			"  ExternalIP [2001:db8:ffff::7]:53/UDP -> [[fd00:1::1]:5353]",
		}, []string{`"not-an-ip" is not a valid IP`}},
		{ExternalIPsNone, nil, nil},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			node := NewNode("node-a", apiNode(), NodeConfig{ExternalIPs: tc.policy})
			got, _, problems := Translate(svc, eps, node)
			want := append(slices.Clone(clusterIPs), tc.external...)
			if r := render(got); strings.Join(r, "\n") != strings.Join(want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(r, "\n"), strings.Join(want, "\n"))
			}
			checkProblems(t, problems, tc.problems)
		})
	}
}
