package nftables

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
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

// packetNode is a node namespace with pods a, b and client serving TCP
// and UDP on 8080, the node address 192.168.100.10, and a Plane
// programming kpr's table inside it.
type packetNode struct {
	node         *harness.Node
	a, b, client *harness.Pod
	nodeIP       netip.Addr
	plane        *Plane
}

func newPacketNode(t *testing.T) *packetNode {
	requireRoot(t)
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
	nodeIP := netip.MustParsePrefix("192.168.100.10/24")
	if err := node.AddAddress(nodeIP); err != nil {
		t.Fatal(err)
	}
	// A socket on the node needs a route to the Service ranges before nat
	// output rewrites the destination; a real node has its default route.
	for _, r := range []*net.IPNet{
		{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(12, 32)},
		{IP: net.IPv4(198, 51, 100, 0), Mask: net.CIDRMask(24, 32)},
	} {
		if err := node.NetNS.Netlink().RouteAdd(&netlink.Route{Dst: r, LinkIndex: node.BridgeIndex}); err != nil {
			t.Fatal(err)
		}
	}
	nft, err := Open(node.NetNS.Path)
	if err != nil {
		t.Fatal(err)
	}
	plane, err := New(Options{NFT: nft, Families: bothFamilies, Conntrack: inNetNS{node.NetNS}, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &packetNode{node: node, a: pods[0], b: pods[1], client: pods[2], nodeIP: nodeIP.Addr(), plane: plane}
}

func (n *packetNode) backends(pods ...*harness.Pod) []dataplane.Backend {
	var bs []dataplane.Backend
	for _, p := range pods {
		bs = append(bs, dataplane.Backend{Addr: p.IPv4, Port: 8080})
	}
	return bs
}

// Real packets through kpr's nftables table: a ClusterIP spreads over
// its endpoints from the node, a NodePort serves a pod (DNAT in
// prerouting, masquerade out), a Service without endpoints is refused at
// once, and a connected UDP socket moves on when its endpoint leaves (the
// conntrack entry fed by the removed-backend diff is deleted).
func TestPacketsReachBackends(t *testing.T) {
	n := newPacketNode(t)
	ab := n.backends(n.a, n.b)
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, ab, nil),
		front(dataplane.NodePort, netip.AddrPortFrom(n.nodeIP, 30080).String(), dataplane.TCP, ab, nil)}}
	empty := &dataplane.ServicePort{Name: spn("shop", "empty", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.2:80", dataplane.TCP, nil, nil)}}
	dnsName := spn("kube-system", "dns", "", dataplane.UDP)
	dns := func(backends ...*harness.Pod) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: dnsName, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.10:53", dataplane.UDP, n.backends(backends...), nil)}}
	}
	if err := n.plane.Reconcile(changes(web, empty, dns(n.a))); err != nil {
		t.Fatal(err)
	}

	// Every backend is reached: 24 tries miss one of two with chance 2^-23.
	clusterIP := netip.MustParseAddrPort("10.96.0.1:80")
	seen := map[string]int{}
	for range 24 {
		who, err := harness.WhoTCP(n.node.NetNS, clusterIP, packetTimeout)
		if err != nil {
			t.Fatalf("node -> ClusterIP %s: %v", clusterIP, err)
		}
		seen[who]++
	}
	if len(seen) != 2 || seen[n.a.Name] == 0 || seen[n.b.Name] == 0 {
		t.Errorf("node -> ClusterIP reached %v, want both %s and %s", seen, n.a.Name, n.b.Name)
	}

	nodePort := netip.AddrPortFrom(n.nodeIP, 30080)
	if who, err := harness.WhoTCP(n.client.NetNS, nodePort, packetTimeout); err != nil || (who != n.a.Name && who != n.b.Name) {
		t.Errorf("pod -> NodePort %s = %q, %v; want %s or %s", nodePort, who, err, n.a.Name, n.b.Name)
	}

	if _, err := harness.DialTCP(n.node.NetNS, netip.MustParseAddrPort("10.96.0.2:80"), packetTimeout); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("node -> ClusterIP without endpoints: %v, want connection refused", err)
	}

	dnsIP := netip.MustParseAddrPort("10.96.0.10:53")
	if who, from, err := harness.WhoUDP(n.node.NetNS, dnsIP, packetTimeout); err != nil || who != n.a.Name || from != dnsIP {
		t.Fatalf("node -> UDP ClusterIP = %q from %s, %v; want %s from %s", who, from, err, n.a.Name, dnsIP)
	}
	conn, err := harness.DialUDP(n.node.NetNS, dnsIP)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if who, err := harness.AskUDP(conn, packetTimeout); err != nil || who != n.a.Name {
		t.Fatalf("connected UDP socket -> %s = %q, %v; want %s", dnsIP, who, err, n.a.Name)
	}
	if err := n.plane.Apply(changes(dns(n.b))); err != nil {
		t.Fatal(err)
	}
	if who, err := harness.AskUDP(conn, packetTimeout); err != nil || who != n.b.Name {
		t.Errorf("after a left, the connected UDP socket reaches %q, %v; want %s (a stale conntrack entry?)", who, err, n.b.Name)
	}
}

// ClientIP affinity: every connection of one client reaches the same
// endpoint, through the affinity sets the endpoint chains fill.
func TestPacketsStickWithAffinity(t *testing.T) {
	n := newPacketNode(t)
	sticky := &dataplane.ServicePort{Name: spn("shop", "cart", "", dataplane.TCP), AffinityTimeout: time.Hour, Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.5:80", dataplane.TCP, n.backends(n.a, n.b), nil)}}
	if err := n.plane.Reconcile(changes(sticky)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for range 16 {
		who, err := harness.WhoTCP(n.client.NetNS, netip.MustParseAddrPort("10.96.0.5:80"), packetTimeout)
		if err != nil {
			t.Fatal(err)
		}
		seen[who]++
	}
	if len(seen) != 1 {
		t.Errorf("one client with ClientIP affinity reached %v, want one endpoint every time", seen)
	}
}

// loadBalancerSourceRanges: a pod outside the ranges is dropped before
// DNAT (not refused), one inside is served, and the NodePort is not
// restricted; a Local policy without local endpoints drops outside
// traffic to the NodePort.
func TestPacketsSourceRangesAndLocalPolicy(t *testing.T) {
	n := newPacketNode(t)
	bs := n.backends(n.a)
	lbIP := netip.MustParseAddrPort("198.51.100.10:80")
	nodePort := netip.AddrPortFrom(n.nodeIP, 30090)
	fenced := &dataplane.ServicePort{Name: spn("shop", "fenced", "", dataplane.TCP), SourceRanges: []netip.Prefix{netip.PrefixFrom(n.b.IPv4, 32)},
		Frontends: []dataplane.Frontend{
			front(dataplane.NodePort, nodePort.String(), dataplane.TCP, bs, nil),
			front(dataplane.LoadBalancer, lbIP.String(), dataplane.TCP, bs, nil)}}
	localPort := netip.AddrPortFrom(n.nodeIP, 30091)
	local := &dataplane.ServicePort{Name: spn("shop", "local", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.NodePort, localPort.String(), dataplane.TCP, bs, []dataplane.Backend{})}}
	if err := n.plane.Reconcile(changes(fenced, local)); err != nil {
		t.Fatal(err)
	}
	if who, err := harness.WhoTCP(n.b.NetNS, lbIP, packetTimeout); err != nil || who != n.a.Name {
		t.Errorf("pod inside the ranges -> %s = %q, %v; want %s", lbIP, who, err, n.a.Name)
	}
	if who, err := harness.WhoTCP(n.client.NetNS, lbIP, packetTimeout); err == nil {
		t.Errorf("pod outside the ranges -> %s reached %s, want it dropped", lbIP, who)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod outside the ranges -> %s was refused, want it dropped", lbIP)
	}
	if who, err := harness.WhoTCP(n.client.NetNS, nodePort, packetTimeout); err != nil || who != n.a.Name {
		t.Errorf("pod outside the ranges -> NodePort %s = %q, %v; want %s: ranges restrict load-balancer IPs only", nodePort, who, err, n.a.Name)
	}
	if who, err := harness.WhoTCP(n.client.NetNS, localPort, packetTimeout); err == nil {
		t.Errorf("pod -> Local NodePort without local endpoints reached %s, want it dropped", who)
	} else if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("pod -> Local NodePort without local endpoints was refused, want it dropped")
	}
	if who, err := harness.WhoTCP(n.node.NetNS, localPort, packetTimeout); err != nil || who != n.a.Name {
		t.Errorf("node -> Local NodePort = %q, %v; want %s: the node's own traffic goes to every endpoint", who, err, n.a.Name)
	}
}

// Endpoint changes while connects go on: every connect is translated.
// Each change rewrites the service chain, and a packet the commit
// overtakes used to miss the old rule's numgen map and leave untranslated
// (no route to host here, the Service range leading nowhere): 7 of
// 14,000 connects did while the endpoints changed 40 times a second.
func TestEndpointChangesLeaveNoConnectUntranslated(t *testing.T) {
	n := newPacketNode(t)
	name := spn("shop", "web", "", dataplane.TCP)
	web := func(pods ...*harness.Pod) *dataplane.ServicePort {
		return &dataplane.ServicePort{Name: name, Frontends: []dataplane.Frontend{
			front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, n.backends(pods...), nil)}}
	}
	if err := n.plane.Reconcile(changes(web(n.a, n.b))); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	var writes atomic.Int64
	const minWrites = 100
	window := harness.ChurnWindow{Min: 15 * time.Second, Max: 90 * time.Second}
	window.Start()
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			next := web(n.a, n.b)
			if writes.Load()%2 == 0 {
				next = web(n.b)
			}
			if err := n.plane.Apply(changes(next)); err != nil {
				t.Errorf("write %d: %v", writes.Load(), err)
				return
			}
			writes.Add(1)
		}
	}()
	vip := netip.MustParseAddrPort("10.96.0.1:80")
	connects := 0
	failed := map[string]int{}
	for ; window.Open(writes.Load() >= minWrites); connects++ {
		if _, err := harness.WhoTCP(n.node.NetNS, vip, packetTimeout); err != nil {
			failed[err.Error()]++
		}
	}
	close(stop)
	<-done
	t.Logf("%d connects during %d endpoint changes", connects, writes.Load())
	if writes.Load() < minWrites {
		t.Fatalf("only %d endpoint changes were written in %v; the test needs many commits during the connects", writes.Load(), window.Max)
	}
	for err, count := range failed {
		t.Errorf("%d of %d connects failed: %s", count, connects, err)
	}
}

// --detect-local-mode, each way of telling a pod's traffic apart: a pod's
// connection to a ClusterIP reaches the backend from the pod's own
// address when its traffic is told apart, and masqueraded (from the
// bridge's address) when not; and under a Local policy without local
// endpoints, the pod's connection to the load-balancer IP goes to every
// endpoint when told apart, and is dropped when not, as in kube-proxy.
func TestLocalTrafficDetection(t *testing.T) {
	n := newPacketNode(t)
	if _, err := n.b.ServeHTTP(8081); err != nil {
		t.Fatal(err)
	}
	backend := []dataplane.Backend{{Addr: n.b.IPv4, Port: 8081}}
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backend, nil),
		// Local policy, and no endpoint on this node for outside traffic.
		front(dataplane.LoadBalancer, "198.51.100.20:80", dataplane.TCP, backend, []dataplane.Backend{})}}
	bridge := n.node.Bridge
	podRange := netip.PrefixFrom(n.client.IPv4, 16).Masked()
	for _, c := range []struct {
		name  string
		local netfilter.LocalTraffic
		pod   bool // the client pod's traffic is told apart as a pod's
	}{
		{"BridgeInterface", netfilter.LocalTraffic{Bridge: bridge}, true},
		{"BridgeInterface other bridge", netfilter.LocalTraffic{Bridge: "kpr-other0"}, false},
		{"InterfaceNamePrefix", netfilter.LocalTraffic{InterfacePrefix: bridge[:4]}, true},
		{"InterfaceNamePrefix other prefix", netfilter.LocalTraffic{InterfacePrefix: "zz"}, false},
		{"ClusterCIDR", netfilter.LocalTraffic{CIDRs: []netip.Prefix{podRange}}, true},
		{"ClusterCIDR other range", netfilter.LocalTraffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("172.31.0.0/16")}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			plane, err := New(Options{NFT: n.plane.nft, Families: bothFamilies, Masquerade: netfilter.Masquerade{Local: c.local}, Log: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			if err := plane.Reconcile(changes(web)); err != nil {
				t.Fatal(err)
			}
			wantSource := n.node.GatewayV4.Addr().String()
			if c.pod {
				wantSource = n.client.IPv4.String()
			}
			got, err := harness.HTTPGet(n.client.NetNS, netip.MustParseAddrPort("10.96.0.1:80"), "/source", packetTimeout)
			if err != nil || strings.TrimSpace(got) != wantSource {
				t.Errorf("pod -> ClusterIP: the backend saw %q (%v), want %s", strings.TrimSpace(got), err, wantSource)
			}
			got, err = harness.HTTPGet(n.client.NetNS, netip.MustParseAddrPort("198.51.100.20:80"), "/source", packetTimeout)
			switch {
			case c.pod && err != nil:
				t.Errorf("pod -> Local-policy load-balancer IP without local endpoints: %v, want it sent to every endpoint", err)
			case !c.pod && err == nil:
				t.Errorf("pod -> Local-policy load-balancer IP without local endpoints reached the backend (%q); want it dropped, as outside traffic", got)
			}
		})
	}
}

// Hairpin: a pod that reaches a Service whose only endpoint is itself is
// masqueraded, or its own reply would go back to it over loopback,
// untranslated, and the connection would never be made.
func TestPacketsHairpin(t *testing.T) {
	n := newPacketNode(t)
	self := &dataplane.ServicePort{Name: spn("shop", "self", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.ClusterIP, "10.96.0.3:80", dataplane.TCP, n.backends(n.client), nil)}}
	if err := n.plane.Reconcile(changes(self)); err != nil {
		t.Fatal(err)
	}
	// The pod's packet goes back out the bridge port it came in by, which
	// the bridge allows only in hairpin mode, as CNI's bridge plugin sets
	// it on a node.
	veth, err := n.node.NetNS.Netlink().LinkByIndex(n.client.HostVethIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.node.NetNS.Netlink().LinkSetHairpin(veth, true); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddrPort("10.96.0.3:80")
	if who, err := harness.WhoTCP(n.client.NetNS, vip, packetTimeout); err != nil || who != n.client.Name {
		t.Fatalf("pod -> ClusterIP %s whose only endpoint is the pod itself = %q, %v; want %s", vip, who, err, n.client.Name)
	}
}
