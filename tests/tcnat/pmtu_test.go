package tcnat

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// The LAN of remote_test.go, but node1 reaches node2's pods over a link of
// their own whose MTU is smaller than the client's:
//
//	client -- lan0 (MTU 1500) -- node1 ext0   (tc programs on both devices)
//	                             node1 narrow0 192.168.200.1, fd00:200::1 (MTU 1280)
//	                               `-- node2 narrow0-peer 192.168.200.2, fd00:200::2
//
// A flow from the client to a NodePort whose backend is on node2 is SNATed
// to node1's address on narrow0 and redirected there; the client's
// full-sized segments do not fit.
const (
	narrowDev = "narrow0"
	narrowMTU = 1280
)

var (
	narrowNode1 = []netip.Prefix{netip.MustParsePrefix("192.168.200.1/24"), netip.MustParsePrefix("fd00:200::1/64")}
	narrowNode2 = []netip.Prefix{netip.MustParsePrefix("192.168.200.2/24"), netip.MustParsePrefix("fd00:200::2/64")}
)

func newNarrowLAN(t *testing.T) *lan {
	t.Helper()
	l := buildLAN(t, 1)
	addNarrowLink(t, l.node1.NetNS, l.node2.NetNS, narrowDev, narrowNode1, narrowNode2)
	// A veth passes a GSO packet on whole, whatever its MTU, where a NIC
	// would send its segments: without segmentation offload, node1's end
	// segments what leaves through it, and the peer drops the segments
	// that do not fit, as the next hop of a real link would.
	setSegmentationOffload(t, l.node1.NetNS, narrowDev, false)
	// node2's pods are reached over the narrow link now.
	for i, dst := range []string{"10.244.1.0/24", "fd00:244:1::/64"} {
		p := netip.MustParsePrefix(dst)
		r := &netlink.Route{Gw: narrowNode2[i].Addr().AsSlice(), Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if err := l.node1.NetNS.Netlink().RouteReplace(r); err != nil {
			t.Fatalf("route %s over %s: %v", dst, narrowDev, err)
		}
	}
	// ExternalIPs, routed from the client to node1 as an upstream router
	// would: each case of a test gets addresses of its own, since the
	// client keeps the path MTU it learns per destination address.
	route(t, l.client.NetNS, "203.0.113.0/24", nodeAddrs[0].Addr())
	route(t, l.client.NetNS, "2001:db8::/64", nodeAddrs[1].Addr())
	for _, a := range narrowNode2 {
		waitReachable(t, l.node1.NetNS, a.Addr())
	}
	l.loadKpr(t, loader.TCOptions{}, fixtureSizes, extDev, narrowDev)
	return l
}

// Path MTU discovery through a NodePort (and an ExternalIP) whose backend
// is on another node behind a link with a smaller MTU: the programs answer
// the client's segments that do not fit with "fragmentation needed"
// (IPv4) or "packet too big" (IPv6) themselves, quoting the segment as the
// client sent it, so the client's connection lowers its segment size and a
// 10 MB echo completes. Without that the upload stalls: the translated
// segment reaches the kernel with the node's own address as its source,
// and is dropped. Both with the client sending GSO packets (TSO on: the
// programs see 64 KiB packets, whose segments do not fit; once the client
// has lowered its segment size, GSO packets whose segments fit pass) and
// with the client sending single segments.
func TestPathMTUToBackendOnAnotherNode(t *testing.T) {
	l := newNarrowLAN(t)
	cases := []struct {
		name string
		kind dataplane.FrontendKind
		fe   netip.AddrPort
		gso  bool
	}{
		{"IPv4/NodePort/GSO", dataplane.NodePort, netip.AddrPortFrom(nodeAddr(false), 30094), true},
		{"IPv4/ExternalIP/segments", dataplane.ExternalIP, netip.MustParseAddrPort("203.0.113.21:80"), false},
		{"IPv6/NodePort/GSO", dataplane.NodePort, netip.AddrPortFrom(nodeAddr(true), 30094), true},
		{"IPv6/ExternalIP/segments", dataplane.ExternalIP, netip.MustParseAddrPort("[2001:db8::21]:80"), false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A backend of its own: a pod that has sent to the node's
			// address on the narrow link before has learnt its path MTU,
			// and advertises a segment size that fits.
			pod, err := l.node2.AddPod(fmt.Sprintf("narrow-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pod.ServeTCP(echoPort); err != nil {
				t.Fatal(err)
			}
			setSegmentationOffload(t, l.client.NetNS, "lan0", tc.gso)
			l.upsert(tc.kind, maps.ScopeInternal, tc.fe, dataplane.TCP, peerBackends(tc.fe.Addr(), echoPort, pod)...)
			before := l.stats().IcmpTooBig
			echo10MB(t, l.client.NetNS, tc.fe)
			if s := l.stats(); s.IcmpTooBig == before || s.Snat == 0 {
				t.Errorf("counters %+v: no ICMP error sent about a SNATed flow, so the test did not exercise path MTU discovery", s)
			}
			if mtu := cachedPathMTU(t, l.client.NetNS, tc.fe.Addr()); mtu != narrowMTU {
				t.Errorf("the client's route to %s has path MTU %d, want the narrow link's %d", tc.fe.Addr(), mtu, narrowMTU)
			}
		})
	}
}

// A GSO packet whose segments do not fit the route is answered like a
// packet that does not fit: the kernel's own check of a redirected packet
// lets every GSO packet pass, whatever its segments. The client sends UDP
// GSO trains (UDP_SEGMENT, one skb of ten 1400-byte datagrams, with DF),
// so every packet the programs see is GSO: only the check of its segments'
// length makes the error that teaches the client the path MTU.
func TestPathMTUForGSOPacketsToBackendOnAnotherNode(t *testing.T) {
	l := newNarrowLAN(t)
	for _, fe := range []netip.AddrPort{netip.MustParseAddrPort("203.0.113.22:53"), netip.MustParseAddrPort("[2001:db8::22]:53")} {
		t.Run(fe.Addr().String(), func(t *testing.T) {
			l.upsert(dataplane.ExternalIP, maps.ScopeInternal, fe, dataplane.UDP, l.backendsOf(fe.Addr(), udpPort)...)
			c := dialGSO(t, l.client.NetNS, fe)
			train := make([]byte, 10*1400)
			learnt := eventually(5*time.Second, func() bool {
				// EMSGSIZE once the path MTU is learnt: the socket's
				// segments no longer fit.
				_, _ = c.Write(train)
				return cachedPathMTU(t, l.client.NetNS, fe.Addr()) == narrowMTU
			})
			if !learnt {
				t.Errorf("the client's route to %s has path MTU %d, want the narrow link's %d (counters %+v)",
					fe.Addr(), cachedPathMTU(t, l.client.NetNS, fe.Addr()), narrowMTU, l.stats())
			}
		})
	}
}

// An IPv4 datagram larger than the client's own link leaves the client in
// fragments that carry no DF. When they do not fit the narrow link to the
// backend's node, the programs answer the first fragment with
// "fragmentation needed" as they answer a packet with DF: a tc program
// cannot fragment, and the kernel, handed the fragment after its SNAT,
// drops it as a martian. The client takes the MTU for its route and
// fragments the next datagram to fit, so a retry is echoed. Without the
// error every try was lost, and the client's route kept no path MTU.
func TestPathMTUWithoutDFToBackendOnAnotherNode(t *testing.T) {
	l := newNarrowLAN(t)
	fe := netip.MustParseAddrPort("203.0.113.23:53")
	l.upsert(dataplane.ExternalIP, maps.ScopeInternal, fe, dataplane.UDP, l.backendsOf(fe.Addr(), udpPort)...)
	before := l.stats().IcmpTooBig
	// 4 KiB: three fragments of up to 1,500 bytes, without DF. echoLarge
	// tries three times; the first is lost.
	if err := echoLarge(l.client.NetNS, fe, 4<<10, l.remote.Name, nil); err != nil {
		t.Errorf("4 KiB datagram in fragments without DF: %v (counters %+v)", err, l.stats())
	}
	if s := l.stats(); s.IcmpTooBig == before {
		t.Errorf("counters %+v: no ICMP error sent about the fragments", s)
	}
	if mtu := cachedPathMTU(t, l.client.NetNS, fe.Addr()); mtu != narrowMTU {
		t.Errorf("the client's route to %s has path MTU %d, want the narrow link's %d", fe.Addr(), mtu, narrowMTU)
	}
}

// Path MTU discovery in the other direction: the backend's replies, on
// their way back to the client, do not fit the node's route to it. Here
// node1 reaches the client over a link of its own whose MTU is 1,280
// bytes (the client sends over the LAN, with MTU 1,500, and so advertises
// a segment size the replies do not fit):
//
//	client lan0 192.168.100.2 ---- node1 ext0 (tc programs) ---- node2's pods
//	client slow0-peer 192.168.201.2 -- node1 slow0 192.168.201.1 (MTU 1280)
//
// The programs answer a reply that does not fit before they rewrite it,
// quoting it as the backend sent it (to the node's SNAT address and port),
// and send the error back to the backend's node; the backend lowers its
// segment size and the 10 MB echo completes, in both families, with the
// backend sending single segments or GSO packets.
func TestPathMTUOfRepliesFromBackendOnAnotherNode(t *testing.T) {
	l := buildLAN(t, 1)
	slowNode1 := []netip.Prefix{netip.MustParsePrefix("192.168.201.1/24"), netip.MustParsePrefix("fd00:201::1/64")}
	slowClient := []netip.Prefix{netip.MustParsePrefix("192.168.201.2/24"), netip.MustParsePrefix("fd00:201::2/64")}
	addNarrowLink(t, l.node1.NetNS, l.client.NetNS, "slow0", slowNode1, slowClient)
	// As for narrow0 (newNarrowLAN): a GSO packet leaving node1 by slow0 is
	// segmented there, and segments that do not fit are lost.
	setSegmentationOffload(t, l.node1.NetNS, "slow0", false)
	for i, a := range clientAddrs {
		waitReachable(t, l.node1.NetNS, slowClient[i].Addr())
		route(t, l.node1.NetNS, netip.PrefixFrom(a.Addr(), a.Addr().BitLen()).String(), slowClient[i].Addr())
	}
	l.loadKpr(t, loader.TCOptions{}, fixtureSizes)
	for i, tc := range []struct {
		name    string
		v6, gso bool
	}{{"IPv4/GSO", false, true}, {"IPv4/segments", false, false}, {"IPv6/GSO", true, true}, {"IPv6/segments", true, false}} {
		fe := netip.AddrPortFrom(nodeAddr(tc.v6), uint16(30095+i))
		t.Run(tc.name, func(t *testing.T) {
			// A backend of its own, which has learnt no path MTU yet.
			pod, err := l.node2.AddPod(fmt.Sprintf("replies-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pod.ServeTCP(echoPort); err != nil {
				t.Fatal(err)
			}
			// Segments: the backend sends single packets, checked by
			// their own length; GSO: packets of many segments, checked
			// by their segments' length.
			setSegmentationOffload(t, pod.NetNS, "eth0", tc.gso)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, peerBackends(fe.Addr(), echoPort, pod)...)
			before := l.stats().IcmpTooBig
			echo10MB(t, l.client.NetNS, fe)
			if s := l.stats(); s.IcmpTooBig == before || s.Snat == 0 {
				t.Errorf("counters %+v: no ICMP error sent about a SNATed flow's replies", s)
			}
			node1 := nodeAddrs[0].Addr()
			if tc.v6 {
				node1 = nodeAddrs[1].Addr()
			}
			if mtu := cachedPathMTU(t, pod.NetNS, node1); mtu != narrowMTU {
				t.Errorf("the backend's route to the node's %s has path MTU %d, want the slow link's %d", node1, mtu, narrowMTU)
			}
		})
	}
}

// dialGSO is a UDP socket in ns connected to fe that sends 1400-byte
// segments, with DF (path MTU discovery on).
func dialGSO(t *testing.T, ns *harness.NetNS, fe netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := harness.Do(ns, func() (err error) {
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(fe))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if fe.Addr().Is6() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		}
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT, 1400)
		}
	})
	if err != nil || serr != nil {
		t.Fatalf("UDP GSO socket to %s: %v, %v", fe, err, serr)
	}
	return c
}

// addNarrowLink joins a and b with a veth pair of MTU narrowMTU, named dev
// in a (and dev-peer in b), with the given addresses on each end.
func addNarrowLink(t *testing.T, a, b *harness.NetNS, dev string, aAddrs, bAddrs []netip.Prefix) {
	t.Helper()
	nlA, nlB := a.Netlink(), b.Netlink()
	peerName := dev + "-peer"
	if err := nlA.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev, MTU: narrowMTU}, PeerName: peerName}); err != nil {
		t.Fatal(err)
	}
	peer, err := nlA.LinkByName(peerName)
	if err != nil {
		t.Fatal(err)
	}
	if err := nlA.LinkSetNsFd(peer, int(b.Handle())); err != nil {
		t.Fatal(err)
	}
	for i, end := range []struct {
		nl    *netlink.Handle
		name  string
		addrs []netip.Prefix
	}{{nlA, dev, aAddrs}, {nlB, peerName, bAddrs}} {
		link, err := end.nl.LinkByName(end.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := end.nl.LinkSetMTU(link, narrowMTU); err != nil {
			t.Fatalf("end %d: set MTU: %v", i, err)
		}
		for _, a := range end.addrs {
			addAddr(t, end.nl, link, a)
		}
		if err := end.nl.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
	}
}

// cachedPathMTU is the MTU the kernel in ns holds for its route to dst: a
// path MTU learnt from an ICMP error, or 0.
func cachedPathMTU(t *testing.T, ns *harness.NetNS, dst netip.Addr) int {
	t.Helper()
	routes, err := ns.Netlink().RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		t.Fatalf("route to %s in %s: %v", dst, ns.Name, err)
	}
	return routes[0].MTU
}

// setSegmentationOffload turns TSO and GSO of dev in ns on or off (ethtool
// -K dev tso on gso on): on, the client's TCP hands its device packets of
// up to 64 KiB that the veth passes on whole; off, one segment each.
func setSegmentationOffload(t *testing.T, ns *harness.NetNS, dev string, on bool) {
	t.Helper()
	type ethtoolValue struct{ cmd, data uint32 }
	type ifreq struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	var data uint32
	if on {
		data = 1
	}
	err := harness.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, cmd := range []uint32{unix.ETHTOOL_STSO, unix.ETHTOOL_SGSO} {
			req := &ifreq{data: unsafe.Pointer(&ethtoolValue{cmd: cmd, data: data})}
			copy(req.name[:], dev)
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(req))); errno != 0 {
				return fmt.Errorf("ethtool command %#x on %s: %w", cmd, dev, errno)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
