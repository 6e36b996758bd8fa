package tcnat

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
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

// The namespace topology: a client outside the cluster, wired to the
// node's external device, and backend pods behind the node.
//
//	client netns                 node netns                      pod netns
//	ext0-wire 192.168.100.2  --  ext0 192.168.100.10  kprbr0  --  eth0 10.244.0.N
//	          fd00:100::2             fd00:100::10    (tc programs on ext0)
//
// The client reaches ExternalIPs and ClusterIPs through routes via the
// node's address, as an upstream router would send them.
type topology struct {
	*progs
	client *harness.Node // only its namespace is used
	node   *harness.Node
	pods   []*harness.Pod
}

const (
	extDev   = "ext0"
	echoPort = 8080
	udpPort  = 5353
)

var (
	clientAddrs = []netip.Prefix{netip.MustParsePrefix("192.168.100.2/24"), netip.MustParsePrefix("fd00:100::2/64")}
	nodeAddrs   = []netip.Prefix{netip.MustParsePrefix("192.168.100.10/24"), netip.MustParsePrefix("fd00:100::10/64")}
	// Routed from the client to the node.
	routedVia = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.96.0.0/16"),
		netip.MustParsePrefix("2001:db8::/64"), netip.MustParsePrefix("fd00:96::/64")}
)

func newTopology(t testing.TB, pods int, mode loader.TCAttachMode) *topology {
	t.Helper()
	return newTopologySized(t, pods, mode, fixtureSizes)
}

// newTopologySized is newTopology with kpr's maps sized as given.
func newTopologySized(t testing.TB, pods int, mode loader.TCAttachMode, sizes loader.MapSizes) *topology {
	t.Helper()
	top := buildTopology(t, pods)
	loaded := loadDataplaneSized(t, newBPFRoot(t), &loader.TCOptions{Devices: []string{extDev}, Mode: mode, NetNS: top.node.NetNS.Path}, sizes)
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		t.Fatal(err)
	}
	top.progs = &progs{t: t, loaded: loaded, lb: lb, ingress: loaded.TC.Ingress, egress: loaded.TC.Egress}
	return top
}

// buildTopology makes the namespaces, links and pods, without kpr.
func buildTopology(t testing.TB, pods int) *topology {
	t.Helper()
	harness.RequireRoot(t)
	node, err := harness.NewNode(t, harness.Options{UplinkName: extDev})
	if err != nil {
		t.Fatal(err)
	}
	client, err := harness.NewNode(t, harness.Options{
		GatewayV4: netip.MustParsePrefix("10.250.0.1/24"), GatewayV6: netip.MustParsePrefix("fd00:250::1/64")})
	if err != nil {
		t.Fatal(err)
	}
	top := &topology{client: client, node: node}
	for _, a := range nodeAddrs {
		if err := node.AddAddress(a); err != nil {
			t.Fatal(err)
		}
	}
	top.cable(t)
	for i := 0; i < pods; i++ {
		pod, err := node.AddPod(fmt.Sprintf("backend-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pod.ServeTCP(echoPort); err != nil {
			t.Fatal(err)
		}
		if _, err := pod.ServeUDP(udpPort); err != nil {
			t.Fatal(err)
		}
		top.pods = append(top.pods, pod)
	}
	return top
}

// cable plugs the node's external device into the client's namespace: the
// uplink's peer moves there and gets the client's addresses and routes.
func (top *topology) cable(t testing.TB) {
	t.Helper()
	wire, err := top.node.NetNS.Netlink().LinkByName(extDev + "-wire")
	if err != nil {
		t.Fatal(err)
	}
	if err := top.node.NetNS.Netlink().LinkSetNsFd(wire, int(top.client.NetNS.Handle())); err != nil {
		t.Fatalf("move %s into the client namespace: %v", wire.Attrs().Name, err)
	}
	nl := top.client.NetNS.Netlink()
	wire, err = nl.LinkByName(extDev + "-wire")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range clientAddrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
		if a.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := nl.AddrAdd(wire, addr); err != nil {
			t.Fatal(err)
		}
	}
	if err := nl.LinkSetUp(wire); err != nil {
		t.Fatal(err)
	}
	for _, dst := range routedVia {
		gw := nodeAddrs[0].Addr()
		if dst.Addr().Is6() {
			gw = nodeAddrs[1].Addr()
		}
		r := &netlink.Route{LinkIndex: wire.Attrs().Index, Gw: gw.AsSlice(),
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}}
		if err := nl.RouteAdd(r); err != nil {
			t.Fatalf("route %s via %s in the client namespace: %v", dst, gw, err)
		}
	}
	// Wait until the node answers (a refused connection is an answer), so
	// that no test's first packet waits out a retransmit behind neighbour
	// discovery or link setup.
	for _, a := range nodeAddrs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := harness.DialTCP(top.client.NetNS, netip.AddrPortFrom(a.Addr(), 9), 200*time.Millisecond)
			if err == nil {
				c.Close()
			}
			if err == nil || errors.Is(err, unix.ECONNREFUSED) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node address %s unreachable from the client: %v", a.Addr(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// backends are the pods' echo servers for proto, in the family of fe.
func (top *topology) backends(fe netip.Addr, proto dataplane.Protocol, pods ...*harness.Pod) []netip.AddrPort {
	port := uint16(echoPort)
	if proto == dataplane.UDP {
		port = udpPort
	}
	return peerBackends(fe, port, pods...)
}

func nodeAddr(v6 bool) netip.Addr {
	if v6 {
		return nodeAddrs[1].Addr()
	}
	return nodeAddrs[0].Addr()
}

var topoFamilies = []struct {
	name string
	v6   bool
}{{"IPv4", false}, {"IPv6", true}}

// A NodePort reached from outside lands on a backend pod, over TCP and UDP,
// and the replies reach the client from the NodePort: a TCP handshake
// completes only then, and the UDP reply's source says so directly.
func TestNodePortFromOutside(t *testing.T) {
	top := newTopology(t, 2, loader.TCAttachAuto)
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30080)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, top.backends(fe.Addr(), dataplane.UDP, top.pods...)...)
			seen := map[string]bool{}
			for i := 0; i < 12; i++ {
				who, err := harness.WhoTCP(top.client.NetNS, fe, 3*time.Second)
				if err != nil {
					t.Fatalf("TCP to NodePort %s from outside: %v", fe, err)
				}
				seen[who] = true
			}
			if len(seen) != 2 {
				t.Errorf("12 connections reached %v, want both backends", seen)
			}
			who, from, err := harness.WhoUDP(top.client.NetNS, fe, 3*time.Second)
			if err != nil {
				t.Fatalf("UDP to NodePort %s from outside: %v", fe, err)
			}
			if !strings.HasPrefix(who, "backend-") || from != fe {
				t.Errorf("UDP reply from %s (%q), want from %s", from, who, fe)
			}
		})
	}
}

// A 10 MB TCP transfer through a NodePort, echoed back by the backend,
// arrives intact both ways, with the programs attached either way.
func TestNodePortBulkTransfer(t *testing.T) {
	for _, mode := range []loader.TCAttachMode{loader.TCAttachTCX, loader.TCAttachLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			skipWithoutTCX(t, mode)
			bulkTransfer(t, mode)
		})
	}
}

func bulkTransfer(t *testing.T, mode loader.TCAttachMode) {
	top := newTopology(t, 1, mode)
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30081)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
			echo10MB(t, top.client.NetNS, fe)
		})
	}
}

// echo10MB sends 10 MB of random bytes to the echo server behind fe and
// fails unless the same bytes come back.
func echo10MB(t *testing.T, ns *harness.NetNS, fe netip.AddrPort) {
	t.Helper()
	c, err := harness.DialTCP(ns, fe, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	data := make([]byte, 10<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		errc <- err
	}()
	got := make([]byte, len(data))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("read the echo back: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("send: %v", err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("10 MB came back altered")
	}
}

// peerServer accepts TCP connections in pod and reports, on each, the
// source address it sees.
func peerServer(t *testing.T, pod *harness.Pod, port uint16) {
	t.Helper()
	var ls []net.Listener
	err := harness.Do(pod.NetNS, func() error {
		for _, network := range []string{"tcp4", "tcp6"} {
			l, err := net.Listen(network, fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			ls = append(ls, l)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s\n", c.RemoteAddr())
				c.Close()
			}
		}()
	}
}

func askPeer(t *testing.T, ns *harness.NetNS, fe netip.AddrPort) (netip.AddrPort, error) {
	t.Helper()
	c, err := harness.DialTCP(ns, fe, 2*time.Second)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.AddrPort{}, err
	}
	ap, err := netip.ParseAddrPort(strings.TrimSpace(line))
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), err
}

// An ExternalIP and a LoadBalancer IP with externalTrafficPolicy: Local
// reach only the local endpoint, and the pod sees the client's own address:
// there is no SNAT.
func TestExternalTrafficPolicyLocalKeepsClientAddress(t *testing.T) {
	top := newTopology(t, 2, loader.TCAttachAuto)
	const peerPort = 9000
	for _, p := range top.pods {
		peerServer(t, p, peerPort)
	}
	local := top.pods[1]
	cases := []struct {
		kind dataplane.FrontendKind
		fe   netip.AddrPort
	}{
		{dataplane.ExternalIP, netip.MustParseAddrPort("203.0.113.7:80")},
		{dataplane.LoadBalancer, netip.MustParseAddrPort("203.0.113.8:80")},
		{dataplane.ExternalIP, netip.MustParseAddrPort("[2001:db8::7]:80")},
	}
	for _, tc := range cases {
		t.Run(tc.kind.String()+"/"+tc.fe.String(), func(t *testing.T) {
			cluster := peerBackends(tc.fe.Addr(), peerPort, top.pods...)
			top.upsert(tc.kind, maps.ScopeInternal, tc.fe, dataplane.TCP, cluster...)
			top.upsert(tc.kind, maps.ScopeExternal, tc.fe, dataplane.TCP, peerBackends(tc.fe.Addr(), peerPort, local)...)
			client := clientAddrs[0].Addr()
			podAddr := local.IPv4
			if tc.fe.Addr().Is6() {
				client, podAddr = clientAddrs[1].Addr(), local.IPv6
			}
			for i := 0; i < 6; i++ {
				peer, err := askPeer(t, top.client.NetNS, tc.fe)
				if err != nil {
					t.Fatalf("%s from outside: %v", tc.fe, err)
				}
				if peer.Addr() != client {
					t.Errorf("the pod saw the connection from %s, want the client's %s", peer, client)
				}
			}
			if v, ok := top.forwardsOnlyTo(tc.fe, podAddr); !ok {
				t.Errorf("flows to %s are not all sent to the local pod %s (entry %s)", tc.fe, podAddr, v)
			}
		})
	}
}

// peerBackends are the pods' addresses in the family of fe, at port.
func peerBackends(fe netip.Addr, port uint16, pods ...*harness.Pod) []netip.AddrPort {
	var out []netip.AddrPort
	for _, p := range pods {
		a := p.IPv4
		if fe.Is6() {
			a = p.IPv6
		}
		out = append(out, netip.AddrPortFrom(a, port))
	}
	return out
}

// forwardsOnlyTo reports whether flows to fe have conntrack entries, all
// of which send them to addr; otherwise it describes a flow that does not.
func (top *topology) forwardsOnlyTo(fe netip.AddrPort, addr netip.Addr) (string, bool) {
	found := false
	for _, f := range top.flows() {
		if f.Frontend != fe {
			continue
		}
		if f.Backend.Addr() != addr {
			return fmt.Sprintf("%+v", f), false
		}
		found = true
	}
	return "", found
}

// Traffic from outside to a ClusterIP is not served, and a Local frontend
// on a node without local endpoints drops what comes from outside.
func TestNotServedFromOutside(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	clusterIP := netip.MustParseAddrPort("10.96.0.10:80")
	top.upsert(dataplane.ClusterIP, maps.ScopeInternal, clusterIP, dataplane.TCP, top.backends(clusterIP.Addr(), dataplane.TCP, top.pods...)...)
	noLocal := netip.AddrPortFrom(nodeAddr(false), 30082)
	top.upsert(dataplane.NodePort, maps.ScopeInternal, noLocal, dataplane.TCP, top.backends(noLocal.Addr(), dataplane.TCP, top.pods...)...)
	top.upsert(dataplane.NodePort, maps.ScopeExternal, noLocal, dataplane.TCP)
	for _, fe := range []netip.AddrPort{clusterIP, noLocal} {
		if who, err := harness.WhoTCP(top.client.NetNS, fe, time.Second); err == nil {
			t.Errorf("%s from outside reached %s, want it not served", fe, who)
		}
	}
	if s := top.stats(); s.ClusterIpOutside == 0 || s.DropNoBackend == 0 {
		t.Errorf("counters %+v, want a ClusterIP from outside and a drop for no backend", s)
	}
	// The node itself still answers from outside: the programs pass what
	// is not a Service.
	peerServerInNode(t, top.node, 9001)
	if _, err := askPeer(t, top.client.NetNS, netip.AddrPortFrom(nodeAddr(false), 9001)); err != nil {
		t.Errorf("a port of the node from outside: %v", err)
	}
}

// peerServerInNode is peerServer on the node's own (host network) namespace.
func peerServerInNode(t *testing.T, node *harness.Node, port uint16) {
	t.Helper()
	var l net.Listener
	err := harness.Do(node.NetNS, func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
}

// Path MTU discovery through a NodePort: the pods sit behind a bridge with a
// smaller MTU than the client's link, so the node's forwarding answers the
// client's full-sized segments with "fragmentation needed" (IPv4) or
// "packet too big" (IPv6) about the translated packet. Translated back, the
// error reaches the client's connection, which shrinks its segments, and a
// 10 MB echo completes.
func TestPathMTUThroughNodePort(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	nl := top.node.NetNS.Netlink()
	br, err := nl.LinkByName(top.node.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetMTU(br, 1280); err != nil {
		t.Fatalf("lower the MTU of %s: %v", top.node.Bridge, err)
	}
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30083)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
			echo10MB(t, top.client.NetNS, fe)
		})
	}
	if s := top.stats(); s.IcmpTranslated == 0 {
		t.Errorf("counters %+v: no ICMP error was translated, so the test did not exercise path MTU discovery", s)
	}
}
