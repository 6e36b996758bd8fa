package tcnat

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// Two nodes on one LAN with the client; kpr's programs run on the first
// node only, and the backend is a pod of the second:
//
//	client netns: bridge lan0 192.168.100.2, fd00:100::2
//	   |- node1 ext0 192.168.100.10  (tc programs)   pods 10.244.0.0/24
//	   `- node2 ext0 192.168.100.11                   pods 10.244.1.0/24
//
// Each node routes the other's pod subnet via the other's address, as a
// flat-network CNI would.
type lan struct {
	*progs
	client       *harness.Node
	node1, node2 *harness.Node
	remote       *harness.Pod   // on node2
	remotes      []*harness.Pod // on node2, remote first
}

var node2Addrs = []netip.Prefix{netip.MustParsePrefix("192.168.100.11/24"), netip.MustParsePrefix("fd00:100::11/64")}

func newLAN(t *testing.T, tcOpts loader.TCOptions) *lan {
	t.Helper()
	l := buildLAN(t, 1)
	l.loadKpr(t, tcOpts, fixtureSizes)
	return l
}

// buildLAN makes the namespaces, the LAN and remotePods echo pods on node2,
// without kpr.
func buildLAN(t testing.TB, remotePods int) *lan {
	t.Helper()
	harness.RequireRoot(t)
	l := &lan{}
	var err error
	if l.node1, err = harness.NewNode(t, harness.Options{UplinkName: extDev}); err != nil {
		t.Fatal(err)
	}
	if l.node2, err = harness.NewNode(t, harness.Options{UplinkName: extDev,
		GatewayV4: netip.MustParsePrefix("10.244.1.1/24"), GatewayV6: netip.MustParsePrefix("fd00:244:1::1/64")}); err != nil {
		t.Fatal(err)
	}
	if l.client, err = harness.NewNode(t, harness.Options{
		GatewayV4: netip.MustParsePrefix("10.250.0.1/24"), GatewayV6: netip.MustParsePrefix("fd00:250::1/64")}); err != nil {
		t.Fatal(err)
	}
	cl := l.client.NetNS.Netlink()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lan0"}}
	if err := cl.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	for _, a := range clientAddrs {
		addAddr(t, cl, br, a)
	}
	if err := cl.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	for i, n := range []*harness.Node{l.node1, l.node2} {
		addrs := nodeAddrs
		if i == 1 {
			addrs = node2Addrs
		}
		for _, a := range addrs {
			if err := n.AddAddress(a); err != nil {
				t.Fatal(err)
			}
		}
		plugInto(t, n, l.client, br, fmt.Sprintf("lan-n%d", i+1))
	}
	route(t, l.node1.NetNS, "10.244.1.0/24", node2Addrs[0].Addr())
	route(t, l.node1.NetNS, "fd00:244:1::/64", node2Addrs[1].Addr())
	route(t, l.node2.NetNS, "10.244.0.0/24", nodeAddrs[0].Addr())
	route(t, l.node2.NetNS, "fd00:244::/64", nodeAddrs[1].Addr())

	for i := 0; i < remotePods; i++ {
		pod, err := l.node2.AddPod(fmt.Sprintf("remote-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pod.ServeTCP(echoPort); err != nil {
			t.Fatal(err)
		}
		if _, err := pod.ServeUDP(udpPort); err != nil {
			t.Fatal(err)
		}
		l.remotes = append(l.remotes, pod)
	}
	l.remote = l.remotes[0]
	for _, a := range append(append([]netip.Prefix{}, nodeAddrs...), node2Addrs...) {
		waitReachable(t, l.client.NetNS, a.Addr())
	}
	return l
}

// loadKpr loads kpr's maps, sized as given, and its tc programs on node1's
// devices (its external device unless given).
func (l *lan) loadKpr(t testing.TB, tcOpts loader.TCOptions, sizes loader.MapSizes, devices ...string) {
	t.Helper()

	// The devices are found in the namespace TCOptions.NetNS names, as
	// `kpr run --host-netns` has it: node1's external device unless given.
	if len(devices) == 0 {
		devices = []string{extDev}
	}
	tcOpts.Devices, tcOpts.NetNS = devices, l.node1.NetNS.Path
	loaded := loadDataplaneSized(t, newBPFRoot(t), &tcOpts, sizes)
	tc := loaded.TC
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		t.Fatal(err)
	}
	l.progs = &progs{t: t, loaded: loaded, lb: lb, ingress: tc.Ingress, egress: tc.Egress}
}

// plugInto moves node's uplink peer into the client namespace, named name,
// as a port of bridge br.
func plugInto(t testing.TB, node, client *harness.Node, br netlink.Link, name string) {
	t.Helper()
	nl := node.NetNS.Netlink()
	wire, err := nl.LinkByName(extDev + "-wire")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetName(wire, name); err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetNsFd(wire, int(client.NetNS.Handle())); err != nil {
		t.Fatal(err)
	}
	cl := client.NetNS.Netlink()
	if wire, err = cl.LinkByName(name); err != nil {
		t.Fatal(err)
	}
	if err := cl.LinkSetMaster(wire, br); err != nil {
		t.Fatal(err)
	}
	if err := cl.LinkSetUp(wire); err != nil {
		t.Fatal(err)
	}
}

func addAddr(t testing.TB, nl *netlink.Handle, l netlink.Link, a netip.Prefix) {
	t.Helper()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
	if a.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := nl.AddrAdd(l, addr); err != nil {
		t.Fatalf("add %s to %s: %v", a, l.Attrs().Name, err)
	}
}

func route(t testing.TB, ns *harness.NetNS, dst string, gw netip.Addr) {
	t.Helper()
	p := netip.MustParsePrefix(dst)
	r := &netlink.Route{Gw: gw.AsSlice(), Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if err := ns.Netlink().RouteAdd(r); err != nil {
		t.Fatalf("route %s via %s in %s: %v", dst, gw, ns.Name, err)
	}
}

// waitReachable waits until addr answers TCP from ns (a refused
// connection is an answer), so that no test's first packet waits out a
// retransmit behind neighbour discovery or link setup.
func waitReachable(t testing.TB, ns *harness.NetNS, addr netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := harness.DialTCP(ns, netip.AddrPortFrom(addr, 9), 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		if err == nil || errors.Is(err, unix.ECONNREFUSED) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s unreachable from %s: %v", addr, ns.Name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A NodePort whose backend is on another node: the flow is SNATed to the
// node's address (the pod sees the node, not the client), sent on through
// a FIB lookup and redirect, and the replies come back to the client from
// the NodePort. TCP (with a 10 MB echo) and UDP, both families.
func TestNodePortToBackendOnAnotherNode(t *testing.T) {
	l := newLAN(t, loader.TCOptions{})
	const peerPort = 9000
	peerServer(t, l.remote, peerPort)
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30090)
			peerFE := netip.AddrPortFrom(nodeAddr(fam.v6), 30091)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, l.backendsOf(fe.Addr(), udpPort)...)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, peerFE, dataplane.TCP, l.backendsOf(fe.Addr(), peerPort)...)

			who, err := harness.WhoTCP(l.client.NetNS, fe, 3*time.Second)
			if err != nil || who != l.remote.Name {
				t.Fatalf("TCP to %s from outside: %q, %v; want %s", fe, who, err, l.remote.Name)
			}
			peer, err := askPeer(t, l.client.NetNS, peerFE)
			if err != nil {
				t.Fatal(err)
			}
			if peer.Addr() != nodeAddr(fam.v6) {
				t.Errorf("the remote pod saw the flow from %s, want the node's %s (SNAT)", peer, nodeAddr(fam.v6))
			}
			if p := peer.Port(); p < 1024 || p > 32767 {
				t.Errorf("SNAT source port %d is outside the default SNAT range 1024-32767", p)
			}
			who, from, err := harness.WhoUDP(l.client.NetNS, fe, 3*time.Second)
			if err != nil || who != l.remote.Name || from != fe {
				t.Errorf("UDP to %s: %q from %s, %v; want %s from %s", fe, who, from, err, l.remote.Name, fe)
			}
			echo10MB(t, l.client.NetNS, fe)
			snated := 0
			for _, f := range l.flows() {
				if f.Frontend != peerFE {
					continue
				}
				if f.SNAT != netip.AddrPortFrom(nodeAddr(fam.v6), peer.Port()) {
					t.Errorf("conntrack shows flow %+v, want it SNATed to %s:%d", f, nodeAddr(fam.v6), peer.Port())
				}
				snated++
			}
			if snated != 1 {
				t.Errorf("conntrack shows %d flows to %s, want the one asked", snated, peerFE)
			}
		})
	}
	if s := l.stats(); s.Snat == 0 || s.Redirected == 0 {
		t.Errorf("counters %+v, want SNATed flows and redirects", s)
	}
}

func (l *lan) backendsOf(fe netip.Addr, port uint16) []netip.AddrPort {
	a := l.remote.IPv4
	if fe.Is6() {
		a = l.remote.IPv6
	}
	return []netip.AddrPort{netip.AddrPortFrom(a, port)}
}

// A flow closed by both sides gives its SNAT port to the next new flow,
// as netfilter's NAT reuses a tuple in TIME_WAIT: with two ports, a client
// that opens and closes a connection per request goes on being served,
// although each closed flow waits out its closing time (ct_tcp_fin_s).
func TestClosedFlowsGiveUpTheirSNATPorts(t *testing.T) {
	l := newLAN(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61001}})
	fe := netip.AddrPortFrom(nodeAddr(false), 30097)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)
	for i := 0; i < 6; i++ {
		c, err := harness.DialTCP(l.client.NetNS, fe, 3*time.Second)
		if err != nil {
			t.Fatalf("request %d: %v (counters %+v)", i, err, l.stats())
		}
		buf := make([]byte, 64)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := c.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), l.remote.Name) {
			c.Close()
			t.Fatalf("request %d: greeting %q, %v", i, buf[:n], err)
		}
		// The client closes; the echo server closes on its EOF: a FIN
		// each way.
		c.Close()
		time.Sleep(200 * time.Millisecond)
	}
	if s := l.stats(); s.DropSnatPorts != 0 || s.SnatTakeover == 0 {
		t.Errorf("counters %+v: want no drop for want of a port, and the closed flows' ports taken over", s)
	}
}

// With two SNAT ports, two flows to the same backend get one each, a taken
// port being skipped; a third flow finds none and is dropped, counted.
func TestSNATPortsSurviveCollisions(t *testing.T) {
	l := newLAN(t, loader.TCOptions{SNATPorts: [2]uint16{61000, 61001}})
	fe := netip.AddrPortFrom(nodeAddr(false), 30092)
	l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, l.backendsOf(fe.Addr(), echoPort)...)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		c, err := harness.DialTCP(l.client.NetNS, fe, 3*time.Second)
		if err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		open = append(open, c)
		buf := make([]byte, 64)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if n, err := c.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), l.remote.Name) {
			t.Fatalf("flow %d: greeting %q, %v", i, buf[:n], err)
		}
	}
	if c, err := harness.DialTCP(l.client.NetNS, fe, time.Second); err == nil {
		c.Close()
		t.Errorf("a third flow connected with both SNAT ports taken")
	}
	if s := l.stats(); s.Snat != 2 || s.DropSnatPorts == 0 {
		t.Errorf("counters %+v, want 2 SNATed flows and drops for want of a port", s)
	}
}
