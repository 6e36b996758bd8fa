package iptables

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/harness"
)

// Real packets through KUBE-FW-* and KUBE-PROXY-FIREWALL: a load-balancer
// IP with loadBalancerSourceRanges serves a pod inside the ranges and drops
// one outside them, which still reaches the same Service's NodePort; once
// the ranges go, both are served.
func TestLoadBalancerSourceRangesPackets(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) { sourceRangesPackets(t, v) })
	}
}

func sourceRangesPackets(t *testing.T, v netfilter.Variant) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []*harness.Pod
	for _, name := range []string{"backend", "inside", "outside"} {
		p, err := node.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeTCP(8080); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	backend, inside, outside := pods[0], pods[1], pods[2]
	nodeIP := netip.MustParsePrefix("192.168.100.10/24")
	if err := node.AddAddress(nodeIP); err != nil {
		t.Fatal(err)
	}
	// The load-balancer IP is also a local address of the node, as a load
	// balancer agent's ip rule makes it: a packet that the nat rules leave
	// alone is delivered to the node's port 80, where nothing listens, and
	// refused, unless filter KUBE-PROXY-FIREWALL drops it first.
	if err := node.AddAddress(netip.MustParsePrefix("198.51.100.10/32")); err != nil {
		t.Fatal(err)
	}
	plane, err := New(Options{
		Runner:   netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", node.NetNS.Name}},
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)},
		Log:      zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	bs := []dataplane.Backend{{Addr: backend.IPv4, Port: 8080}}
	lbIP := netip.MustParseAddrPort("198.51.100.10:80")
	nodePort := netip.AddrPortFrom(nodeIP.Addr(), 30090)
	lb := func(ranges ...netip.Prefix) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: spn("shop", "fenced", "", dataplane.TCP), SourceRanges: ranges,
			Frontends: []dataplane.Frontend{
				front(dataplane.NodePort, nodePort.String(), dataplane.TCP, bs, nil),
				front(dataplane.LoadBalancer, lbIP.String(), dataplane.TCP, bs, nil)}}
	}
	if err := plane.Reconcile(changes(lb(netip.PrefixFrom(inside.IPv4, 32)))); err != nil {
		t.Fatal(err)
	}
	if who, err := harness.WhoTCP(inside.NetNS, lbIP, packetTimeout); err != nil || who != backend.Name {
		t.Errorf("pod inside the ranges -> %s = %q, %v; want %s", lbIP, who, err, backend.Name)
	}
	if who, err := harness.WhoTCP(outside.NetNS, lbIP, packetTimeout); err == nil {
		t.Errorf("pod outside the ranges -> %s reached %s, want it dropped", lbIP, who)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod outside the ranges -> %s was refused by the node, want it dropped by %s", lbIP, chainProxyFirewall)
	}
	if who, err := harness.WhoTCP(outside.NetNS, nodePort, packetTimeout); err != nil || who != backend.Name {
		t.Errorf("pod outside the ranges -> NodePort %s = %q, %v; want %s: ranges restrict load-balancer IPs only", nodePort, who, err, backend.Name)
	}
	if err := plane.Apply(changes(lb())); err != nil {
		t.Fatal(err)
	}
	if who, err := harness.WhoTCP(outside.NetNS, lbIP, packetTimeout); err != nil || who != backend.Name {
		t.Errorf("without ranges, pod -> %s = %q, %v; want %s", lbIP, who, err, backend.Name)
	}
}
