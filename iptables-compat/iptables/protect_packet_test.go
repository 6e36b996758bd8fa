package iptables

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/harness"
)

// Real packets against kube-proxy's protections in the iptables mode:
// crafted frames sent from a pod's eth0 to the node, through the rules the
// Plane wrote into the node's namespace.

// protectedNode is a harness node with pods and a Plane whose namespace
// was prepared by PrepareNamespace with o's settings.
func protectedNode(t *testing.T, o Options, pods ...string) (*harness.Node, map[string]*harness.Pod, *Plane) {
	t.Helper()
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*harness.Pod{}
	for _, name := range pods {
		p, err := node.AddPod(name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = p
	}
	o.Runner = netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", node.NetNS.Name}}
	o.Families = map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4),
		netfilter.IPv6: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv6)}
	o.Log = zaptest.NewLogger(t)
	if err := harness.Do(node.NetNS, func() error { return PrepareNamespace(&o) }); err != nil {
		t.Fatal(err)
	}
	plane, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return node, out, plane
}

// sysctlIn reads a sysctl in ns.
func sysctlIn(t *testing.T, ns *harness.NetNS, key string) string {
	t.Helper()
	var v []byte
	if err := harness.Do(ns, func() (err error) {
		v, err = os.ReadFile("/proc/sys/" + key)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

// sendFrame sends, from pod p's eth0 to the node's bridge, an Ethernet
// frame with the IPv4 packet of ip and l4. The kernel's own stack never
// sends such packets (to 127.0.0.1, or with SYN and FIN), so they are
// written out whole, checksums included: conntrack calls a packet with a
// wrong one INVALID.
func sendFrame(t *testing.T, node *harness.Node, p *harness.Pod, ip *layers.IPv4, l4 interface {
	gopacket.SerializableLayer
	SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
}, payload []byte) {
	t.Helper()
	br, err := node.NetNS.Netlink().LinkByIndex(node.BridgeIndex)
	if err != nil {
		t.Fatal(err)
	}
	eth, err := p.NetNS.Netlink().LinkByIndex(p.EthIndex)
	if err != nil {
		t.Fatal(err)
	}
	ip.Version, ip.IHL, ip.TTL = 4, 5, 64
	if err := l4.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: eth.Attrs().HardwareAddr, DstMAC: br.Attrs().HardwareAddr, EthernetType: layers.EthernetTypeIPv4},
		ip, l4, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	proto := int(htons(unix.ETH_P_IP))
	if err := harness.Do(p.NetNS, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, buf.Bytes(), 0, &unix.SockaddrLinklayer{Ifindex: p.EthIndex, Protocol: uint16(proto)})
	}); err != nil {
		t.Fatalf("send a frame from %s: %v", p.Name, err)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// udpListener listens on addr in ns.
func udpListener(t *testing.T, ns *harness.NetNS, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := harness.Do(ns, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// received reports whether c gets a datagram holding payload within the
// packet timeout.
func received(c *net.UDPConn, payload []byte) bool {
	buf := make([]byte, 1500)
	c.SetReadDeadline(time.Now().Add(packetTimeout))
	for {
		n, err := c.Read(buf)
		if err != nil {
			return false
		}
		if bytes.Equal(buf[:n], payload) {
			return true
		}
	}
}

// sendUDP sends, from pod p to the node, a crafted datagram to dst.
func sendUDP(t *testing.T, node *harness.Node, p *harness.Pod, dst netip.AddrPort, payload []byte) {
	t.Helper()
	ip := &layers.IPv4{SrcIP: p.IPv4.AsSlice(), DstIP: dst.Addr().AsSlice(), Protocol: layers.IPProtocolUDP}
	sendFrame(t, node, p, ip, &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(dst.Port())}, payload)
}

// With localhost NodePorts, route_localnet is set and the node's own
// sockets reach a NodePort on 127.0.0.1; a pod's packet to 127.0.0.1
// (CVE-2020-8558: a neighbour reaching what listens on the node's
// loopback only) is dropped by KUBE-FIREWALL, while the same packet to the
// node's own address arrives.
func TestLocalhostNodePortsAndLocalnetFromOutside(t *testing.T) {
	requireRoot(t)
	node, pods, plane := protectedNode(t, Options{LocalhostNodePorts: true}, "backend", "neighbour")
	backend, neighbour := pods["backend"], pods["neighbour"]
	if _, err := backend.ServeTCP(8080); err != nil {
		t.Fatal(err)
	}
	if got := sysctlIn(t, node.NetNS, "net/ipv4/conf/all/route_localnet"); got != "1" {
		t.Fatalf("route_localnet = %s with localhost NodePorts, want 1", got)
	}
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.NodePort, "127.0.0.1:30080", dataplane.TCP, []dataplane.Backend{{Addr: backend.IPv4, Port: 8080}}, nil)}}
	if err := plane.Reconcile(changes(web)); err != nil {
		t.Fatal(err)
	}
	localhost := netip.MustParseAddrPort("127.0.0.1:30080")
	if who, err := harness.WhoTCP(node.NetNS, localhost, packetTimeout); err != nil || who != backend.Name {
		t.Errorf("node -> localhost NodePort %s = %q, %v; want %s", localhost, who, err, backend.Name)
	}

	// Something that listens on the node's loopback only, as the
	// kubelet's healthz does, and the same port on the node's address.
	loopback := udpListener(t, node.NetNS, netip.MustParseAddrPort("127.0.0.1:10248"))
	gateway := udpListener(t, node.NetNS, netip.AddrPortFrom(node.GatewayV4.Addr(), 10248))
	sendUDP(t, node, neighbour, netip.AddrPortFrom(node.GatewayV4.Addr(), 10248), []byte("to the node"))
	if !received(gateway, []byte("to the node")) {
		t.Fatal("a crafted datagram to the node's own address did not arrive: the test's frames do not reach the node")
	}
	sendUDP(t, node, neighbour, netip.MustParseAddrPort("127.0.0.1:10248"), []byte("to loopback"))
	if received(loopback, []byte("to loopback")) {
		t.Error("a pod's datagram to 127.0.0.1 reached a socket on the node's loopback; KUBE-FIREWALL should drop it")
	}
}

// Without localhost NodePorts (--iptables-localhost-nodeports=false),
// route_localnet stays 0, no rule serves the NodePort on 127.0.0.1, and
// the kernel itself drops a pod's packet to 127.0.0.1.
func TestNoLocalhostNodePorts(t *testing.T) {
	requireRoot(t)
	node, pods, plane := protectedNode(t, Options{LocalhostNodePorts: false}, "backend", "neighbour")
	backend, neighbour := pods["backend"], pods["neighbour"]
	if _, err := backend.ServeTCP(8080); err != nil {
		t.Fatal(err)
	}
	web := &dataplane.ServicePort{Name: spn("shop", "web", "", dataplane.TCP), Frontends: []dataplane.Frontend{
		front(dataplane.NodePort, "127.0.0.1:30080", dataplane.TCP, []dataplane.Backend{{Addr: backend.IPv4, Port: 8080}}, nil),
		front(dataplane.NodePort, netip.AddrPortFrom(node.GatewayV4.Addr(), 30080).String(), dataplane.TCP, []dataplane.Backend{{Addr: backend.IPv4, Port: 8080}}, nil)}}
	if err := plane.Reconcile(changes(web)); err != nil {
		t.Fatal(err)
	}
	if got := sysctlIn(t, node.NetNS, "net/ipv4/conf/all/route_localnet"); got != "0" {
		t.Errorf("route_localnet = %s without localhost NodePorts, want 0", got)
	}
	saved, err := plane.run.Run(plane.tools[netfilter.IPv4].Save, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(saved), "\n") {
		if strings.Contains(l, "127.0.0.") {
			t.Errorf("the tables hold a rule for 127.0.0.0/8 without localhost NodePorts: %s", l)
		}
	}
	// The node's address still serves the NodePort.
	nodePort := netip.AddrPortFrom(node.GatewayV4.Addr(), 30080)
	if who, err := harness.WhoTCP(neighbour.NetNS, nodePort, packetTimeout); err != nil || who != backend.Name {
		t.Errorf("pod -> NodePort %s = %q, %v; want %s", nodePort, who, err, backend.Name)
	}
	if who, err := harness.WhoTCP(node.NetNS, netip.MustParseAddrPort("127.0.0.1:30080"), packetTimeout); err == nil {
		t.Errorf("node -> 127.0.0.1:30080 reached %q; without localhost NodePorts nothing serves it", who)
	}
	loopback := udpListener(t, node.NetNS, netip.MustParseAddrPort("127.0.0.1:10248"))
	sendUDP(t, node, neighbour, netip.MustParseAddrPort("127.0.0.1:10248"), []byte("to loopback"))
	if received(loopback, []byte("to loopback")) {
		t.Error("a pod's datagram to 127.0.0.1 reached the node's loopback with route_localnet 0")
	}
}

// KUBE-FORWARD drops what conntrack calls INVALID (kubernetes#74839), here
// a TCP segment with SYN and FIN, which no stack sends, on its way through
// the node from one pod to an address routed to another; a plain SYN on
// the same path is forwarded. With nf_conntrack_tcp_be_liberal set the
// rule is left out, as kube-proxy leaves it out, and the segment goes
// through.
func TestInvalidPacketsAreNotForwarded(t *testing.T) {
	requireRoot(t)
	for _, liberal := range []bool{false, true} {
		name := "strict"
		if liberal {
			name = "tcp-be-liberal"
		}
		t.Run(name, func(t *testing.T) { invalidPacketsAreNotForwarded(t, liberal) })
	}
}

func invalidPacketsAreNotForwarded(t *testing.T, liberal bool) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if liberal {
		// Conntrack is loaded once the rules use it; the setting is
		// per namespace.
		if err := harness.Do(node.NetNS, func() error {
			return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", []byte("1"), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	sender, err := node.AddPod("sender")
	if err != nil {
		t.Fatal(err)
	}
	receiver, err := node.AddPod("receiver")
	if err != nil {
		t.Fatal(err)
	}
	// An address of the receiver's that the node routes to it: the pods
	// share the bridge, so only traffic the node routes passes FORWARD.
	routed := netip.MustParseAddr("10.250.0.2")
	if err := receiver.NetNS.Netlink().AddrAdd(mustLink(t, receiver), &netlink.Addr{IPNet: netlink.NewIPNet(routed.AsSlice())}); err != nil {
		t.Fatal(err)
	}
	if err := node.NetNS.Netlink().RouteAdd(&netlink.Route{Dst: netlink.NewIPNet(routed.AsSlice()), Gw: receiver.IPv4.AsSlice(), LinkIndex: node.BridgeIndex}); err != nil {
		t.Fatal(err)
	}
	o := Options{Runner: netfilter.ExecRunner{Prefix: []string{"ip", "netns", "exec", node.NetNS.Name}},
		Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4)},
		Log:      zaptest.NewLogger(t)}
	if err := harness.Do(node.NetNS, func() error { return PrepareNamespace(&o) }); err != nil {
		t.Fatal(err)
	}
	if o.ConntrackTCPLiberal != liberal {
		t.Fatalf("PrepareNamespace read ConntrackTCPLiberal %v, want %v", o.ConntrackTCPLiberal, liberal)
	}
	plane, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := plane.Reconcile(nil); err != nil {
		t.Fatal(err)
	}

	var raw net.PacketConn
	if err := harness.Do(receiver.NetNS, func() (err error) {
		raw, err = net.ListenPacket("ip4:tcp", routed.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	send := func(port uint16, fin bool) {
		ip := &layers.IPv4{SrcIP: sender.IPv4.AsSlice(), DstIP: routed.AsSlice(), Protocol: layers.IPProtocolTCP}
		sendFrame(t, node, sender, ip, &layers.TCP{SrcPort: 40000, DstPort: layers.TCPPort(port), Seq: 1, SYN: true, FIN: fin, Window: 1024}, nil)
	}
	// arrived reports whether a segment to port reaches the receiver.
	arrived := func(port uint16) bool {
		buf := make([]byte, 1500)
		raw.SetReadDeadline(time.Now().Add(packetTimeout))
		for {
			n, _, err := raw.ReadFrom(buf)
			if err != nil {
				return false
			}
			if n >= 4 && binary.BigEndian.Uint16(buf[2:4]) == port {
				return true
			}
		}
	}
	send(9001, false)
	if !arrived(9001) {
		t.Fatal("a plain SYN from one pod to the other's routed address was not forwarded: the test's path does not work")
	}
	send(9002, true)
	if got := arrived(9002); got != liberal {
		t.Errorf("a SYN|FIN segment (conntrack: INVALID) forwarded = %v, want %v (nf_conntrack_tcp_be_liberal %v)", got, liberal, liberal)
	}
}

func mustLink(t *testing.T, p *harness.Pod) netlink.Link {
	t.Helper()
	l, err := p.NetNS.Netlink().LinkByIndex(p.EthIndex)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
