package iptables

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/harness"
)

const packetTimeout = 2 * time.Second

// inNetNS runs the netlink conntrack cleaner inside the node namespace,
// where kpr would run it.
type inNetNS struct{ ns *harness.NetNS }

func (c inNetNS) DeleteStaleUDP(served netfilter.UDPFrontends) (n int, err error) {
	doErr := harness.Do(c.ns, func() error {
		n, err = netfilter.NetlinkConntrack{}.DeleteStaleUDP(served)
		return nil
	})
	return n, errors.Join(doErr, err)
}

// Real packets through the rules: a node namespace with pods, the Plane
// programming iptables inside it, and clients on the node and in a pod.
func TestPacketsReachBackends(t *testing.T) {
	requireRoot(t)
	for _, v := range []netfilter.Variant{netfilter.NFT, netfilter.Legacy} {
		t.Run(string(v), func(t *testing.T) { packetsReachBackends(t, v) })
	}
}

func packetsReachBackends(t *testing.T, v netfilter.Variant) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []*harness.Pod
	for _, name := range []string{"a", "b", "client"} {
		p, err := node.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeTCP(8080); err != nil {
			t.Fatal(err)
		}
		if _, err := p.ServeUDP(8080); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	a, b, client := pods[0], pods[1], pods[2]
	nodeIP := netip.MustParsePrefix("192.168.100.10/24")
	if err := node.AddAddress(nodeIP); err != nil {
		t.Fatal(err)
	}
	// A socket on the node needs a route to the Service range before nat
	// OUTPUT rewrites the destination; a real node has its default route.
	serviceRange := &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(12, 32)}
	if err := node.NetNS.Netlink().RouteAdd(&netlink.Route{Dst: serviceRange, LinkIndex: node.BridgeIndex}); err != nil {
		t.Fatal(err)
	}
	plane, err := New(Options{
		Runner:    netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", node.NetNS.Name}},
		Families:  map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(v, netfilter.IPv4), netfilter.IPv6: netfilter.ToolsFor(v, netfilter.IPv6)},
		Conntrack: inNetNS{node.NetNS},
		Log:       zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}

	ab := []dataplane.Backend{{Addr: a.IPv4, Port: 8080}, {Addr: b.IPv4, Port: 8080}}
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, ab, nil),
		front(dataplane.NodePort, netip.AddrPortFrom(nodeIP.Addr(), 30080).String(), dataplane.TCP, ab, nil)}}
	empty := &dataplane.ServicePort{Name: spn("shop", "empty", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.2:80", dataplane.TCP, nil, nil)}}
	dnsName := spn("kube-system", "dns", "", dataplane.UDP)
	dns := func(backends ...*harness.Pod) *dataplane.ServicePort {
		var bs []dataplane.Backend
		for _, p := range backends {
			bs = append(bs, dataplane.Backend{Addr: p.IPv4, Port: 8080})
		}
		return &dataplane.ServicePort{Name: dnsName, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, bs, nil)}}
	}
	if err := plane.Reconcile(changes(web, empty, dns(a))); err != nil {
		t.Fatal(err)
	}

	// Every backend is reached: 24 tries miss one of two with chance 2^-23.
	clusterIP := netip.MustParseAddrPort("10.96.0.1:80")
	seen := map[string]int{}
	for range 24 {
		who, err := harness.WhoTCP(node.NetNS, clusterIP, packetTimeout)
		if err != nil {
			t.Fatalf("node -> ClusterIP %s: %v", clusterIP, err)
		}
		seen[who]++
	}
	if len(seen) != 2 || seen[a.Name] == 0 || seen[b.Name] == 0 {
		t.Errorf("node -> ClusterIP reached %v, want both %s and %s", seen, a.Name, b.Name)
	}

	// From a pod to the NodePort: DNAT in PREROUTING, masquerade out.
	nodePort := netip.AddrPortFrom(nodeIP.Addr(), 30080)
	if who, err := harness.WhoTCP(client.NetNS, nodePort, packetTimeout); err != nil || (who != a.Name && who != b.Name) {
		t.Errorf("pod -> NodePort %s = %q, %v; want %s or %s", nodePort, who, err, a.Name, b.Name)
	}

	// No endpoints: refused at once, not a timeout.
	if _, err := harness.DialTCP(node.NetNS, netip.MustParseAddrPort("10.96.0.2:80"), packetTimeout); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("node -> ClusterIP without endpoints: %v, want connection refused", err)
	}

	// UDP: the reply comes from the ClusterIP, and once a leaves the
	// Service the same connected socket reaches b: its conntrack entry,
	// which still pointed at a, was deleted.
	dnsIP := netip.MustParseAddrPort("10.96.0.10:53")
	if who, from, err := harness.WhoUDP(node.NetNS, dnsIP, packetTimeout); err != nil || who != a.Name || from != dnsIP {
		t.Fatalf("node -> UDP ClusterIP = %q from %s, %v; want %s from %s", who, from, err, a.Name, dnsIP)
	}
	conn, err := harness.DialUDP(node.NetNS, dnsIP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if who, err := harness.AskUDP(conn, packetTimeout); err != nil || who != a.Name {
		t.Fatalf("connected UDP socket -> %s = %q, %v; want %s", dnsIP, who, err, a.Name)
	}
	if err := plane.Apply(changes(dns(b))); err != nil {
		t.Fatal(err)
	}
	if who, err := harness.AskUDP(conn, packetTimeout); err != nil || who != b.Name {
		t.Errorf("after a left, the connected UDP socket reaches %q, %v; want %s (a stale conntrack entry?)", who, err, b.Name)
	}
}
