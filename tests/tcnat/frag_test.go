package tcnat

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// The datagram sizes sent through a NodePort in fragments: both are larger
// than the 1500-byte MTU of every link of the topologies, so the client
// and the backend fragment them, and the programs see the fragments.
var fragSizes = []int{4 << 10, 60 << 10}

// UDP datagrams larger than the links' MTU, to a NodePort whose backend is
// on this node: the client's fragments are DNATed on the way in (only the
// first carries the ports) and the backend's echo, fragmented too, leaves
// with the NodePort's address. Both families.
func TestFragmentedUDPToLocalBackend(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	pod := top.pods[0]
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30100)
			backends := top.backends(fe.Addr(), dataplane.UDP, pod)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, backends...)
			for _, size := range fragSizes {
				if err := echoLarge(top.client.NetNS, fe, size, pod.Name, nil); err != nil {
					t.Errorf("%d-byte datagram: %v", size, err)
				}
			}
			checkFragsSeen(t, top.progs, fe.Addr(), backends[0].Addr())
		})
	}
	if s := top.stats(); s.Fragment != 0 || s.DropFragment != 0 {
		t.Errorf("counters %+v, want no fragment passed or dropped untranslated", s)
	}
}

// The same to a NodePort whose backend is on another node: the fragments
// are DNATed and SNATed and redirected, and the backend's fragmented echo
// is un-SNATed and un-DNATed on its way back to the client, which sees it
// from the NodePort, not from the pod.
func TestFragmentedUDPToRemoteBackend(t *testing.T) {
	l := newLAN(t, loader.TCOptions{})
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30101)
			backends := l.backendsOf(fe.Addr(), udpPort)
			l.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, backends...)
			for _, size := range fragSizes {
				if err := echoLarge(l.client.NetNS, fe, size, l.remote.Name, nil); err != nil {
					t.Errorf("%d-byte datagram: %v", size, err)
				}
			}
			checkFragsSeen(t, l.progs, fe.Addr(), backends[0].Addr())
		})
	}
	if s := l.stats(); s.Fragment != 0 || s.DropFragment != 0 || s.Snat == 0 {
		t.Errorf("counters %+v, want SNATed flows and no fragment passed or dropped untranslated", s)
	}
}

// An IPv6 datagram with a destination options header between the IPv6 and
// the UDP header reaches the NodePort's backend and its echo comes back
// from the NodePort; so does one large enough to be fragmented, whose
// first fragment has the options behind its fragment header.
func TestIPv6DestinationOptionsToNodePort(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	pod := top.pods[0]
	fe := netip.AddrPortFrom(nodeAddr(true), 30102)
	top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, top.backends(fe.Addr(), dataplane.UDP, pod)...)
	// Next header (the kernel fills it in), length 0 (8 bytes), and a
	// PadN option filling the rest.
	dstopts := []byte{0, 0, 1, 4, 0, 0, 0, 0}
	withOptions := func(c *net.UDPConn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, string(dstopts))
		}); err != nil {
			return err
		}
		return serr
	}
	for _, size := range []int{64, fragSizes[0]} {
		if err := echoLarge(top.client.NetNS, fe, size, pod.Name, withOptions); err != nil {
			t.Errorf("%d-byte datagram with destination options: %v", size, err)
		}
	}
	if s := top.stats(); s.Translated == 0 || s.Ipv6ExtUnparsed != 0 || s.Fragment != 0 {
		t.Errorf("counters %+v, want translated packets, none passed for an extension header or a fragment", s)
	}
}

// echoLarge sends a datagram of size random bytes from ns to fe and waits
// for the UDP echo server's reply: it must come from fe, from the pod
// named who, with the payload unchanged. setup, if set, prepares the
// socket. UDP may lose a datagram, so it tries three times.
func echoLarge(ns *harness.NetNS, fe netip.AddrPort, size int, who string, setup func(*net.UDPConn) error) error {
	c, err := harness.ListenUDP(ns, fe.Addr())
	if err != nil {
		return err
	}
	defer c.Close()
	if setup != nil {
		if err := setup(c); err != nil {
			return fmt.Errorf("set the socket up: %w", err)
		}
	}
	payload := make([]byte, size)
	_, _ = rand.Read(payload)
	buf := make([]byte, 64<<10)
	var last error
	for try := 0; try < 3; try++ {
		if _, err := c.WriteToUDPAddrPort(payload, fe); err != nil {
			return fmt.Errorf("send to %s: %w", fe, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			last = fmt.Errorf("no echo from %s: %w", fe, err)
			continue
		}
		want := who + "\n"
		switch {
		case from != fe:
			return fmt.Errorf("echo from %s, want %s", from, fe)
		case n != len(want)+size || string(buf[:len(want)]) != want || string(buf[len(want):n]) != string(payload):
			return fmt.Errorf("echo of %d bytes is not %q and the %d bytes sent", n, want, size)
		}
		return nil
	}
	return last
}

// checkFragsSeen checks that the programs saw the datagrams in fragments
// both ways: kpr_frags holds a first fragment to the frontend (the
// client's) and one from the backend (its echo).
func checkFragsSeen(t *testing.T, p *progs, frontend, backend netip.Addr) {
	t.Helper()
	var k bpf.KprFragKey
	var v bpf.KprFragValue
	toFrontend, fromBackend := false, false
	it := p.loaded.Maps.KprFrags.Iterate()
	for it.Next(&k, &v) {
		toFrontend = toFrontend || k.Daddr == addr16(frontend)
		fromBackend = fromBackend || k.Saddr == addr16(backend)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read kpr_frags: %v", err)
	}
	if !toFrontend || !fromBackend {
		t.Errorf("kpr_frags has a first fragment to %s: %v, from %s: %v; want both (the datagrams were not fragmented?)",
			frontend, toFrontend, backend, fromBackend)
	}
}

// fragV4 is an IPv4 fragment from src to dst carrying body at offset
// (in 8-byte units), with the more-fragments flag as given.
func fragV4(t *testing.T, src, dst netip.Addr, id, offset uint16, more bool, body []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 2},
		EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Id: id, FragOffset: offset, Protocol: layers.IPProtocolUDP,
		SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	if more {
		ip.Flags = layers.IPv4MoreFragments
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, gopacket.Payload(body)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// fragAddrs decodes an IPv4 fragment's addresses and checks its header
// checksum and that its body came through unchanged.
func fragAddrs(t *testing.T, frame, body []byte) (src, dst netip.Addr) {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	ip, ok := pkt.NetworkLayer().(*layers.IPv4)
	if !ok {
		t.Fatalf("not an IPv4 fragment: %v", pkt)
	}
	if sum := onesSum(ip.Contents, 0); sum != 0xffff {
		t.Errorf("IPv4 header checksum does not validate (sum %#04x)", sum)
	}
	if !bytes.Equal(ip.Payload, body) {
		t.Errorf("fragment body changed")
	}
	src, _ = netip.AddrFromSlice(ip.SrcIP)
	dst, _ = netip.AddrFromSlice(ip.DstIP)
	return src, dst
}

// A later fragment that comes before its first one is passed as it is and
// counted; once the first fragment has passed (and been translated), the
// later one is translated too, its addresses only, with a valid header
// checksum and its body unchanged; and the backend's fragmented reply is
// restored at egress the same way. A later fragment to the frontend whose
// flow is gone is dropped, counted, rather than opening a new one.
func TestLaterFragmentFollowsItsFirst(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[0]
	fe, be, client := ap(fam.node, 30103), ap(fam.pod1, 8080), ap(fam.client, 40103)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, be)
	udp := func(src, dst netip.AddrPort) []byte {
		h := binary.BigEndian.AppendUint16(nil, src.Port())
		h = binary.BigEndian.AppendUint16(h, dst.Port())
		h = binary.BigEndian.AppendUint16(h, 8+16+16)
		return append(append(h, 0, 0), "first fragment!!"...) // checksum 0: none
	}
	later := []byte("the later one!!!")

	ret, out := run(t, p.ingress, fragV4(t, client.Addr(), fe.Addr(), 7, 3, false, later))
	if _, dst := fragAddrs(t, out, later); ret != actUnspec || dst != fe.Addr() {
		t.Errorf("a later fragment before its first: verdict %d to %s, want passed untranslated", int32(ret), dst)
	}
	if s := p.stats(); s.Fragment != 1 {
		t.Errorf("counters %+v, want the early fragment counted", s)
	}

	first := udp(client, fe)
	ret, out = run(t, p.ingress, fragV4(t, client.Addr(), fe.Addr(), 7, 0, true, first))
	// gopacket does not decode a fragment's UDP header: the port is read
	// where it is.
	if _, dst := fragAddrs(t, out, udp(client, be)); ret != actUnspec || dst != be.Addr() {
		t.Fatalf("first fragment: verdict %d to %s; want passed to %s", int32(ret), dst, be)
	}
	ret, out = run(t, p.ingress, fragV4(t, client.Addr(), fe.Addr(), 7, 3, false, later))
	if src, dst := fragAddrs(t, out, later); ret != actUnspec || src != client.Addr() || dst != be.Addr() {
		t.Errorf("later fragment: verdict %d, %s->%s; want passed %s->%s", int32(ret), src, dst, client.Addr(), be.Addr())
	}

	// The reply, fragmented by the backend.
	run(t, p.egress, fragV4(t, be.Addr(), client.Addr(), 9, 0, true, udp(be, client)))
	ret, out = run(t, p.egress, fragV4(t, be.Addr(), client.Addr(), 9, 3, false, later))
	if src, dst := fragAddrs(t, out, later); ret != actUnspec || src != fe.Addr() || dst != client.Addr() {
		t.Errorf("later fragment of the reply: verdict %d, %s->%s; want passed %s->%s", int32(ret), src, dst, fe.Addr(), client.Addr())
	}

	// The flow ends; the next later fragment of the datagram opens none.
	p.flushConntrack()
	ret, _ = run(t, p.ingress, fragV4(t, client.Addr(), fe.Addr(), 7, 3, false, later))
	if s := p.stats(); ret != actShot || s.DropFragment != 1 || s.NewFlows != 1 {
		t.Errorf("later fragment without its flow: verdict %d, counters %+v; want dropped, counted, no new flow", int32(ret), s)
	}
}

// --map-size-frags sizes kpr_frags, which holds each fragmented
// datagram's translation from its first fragment until its later ones
// pass. With room for fewer datagrams than are in flight, the later
// fragments of the oldest find no entry and pass untranslated (counted,
// nat_stats.fragment); the default size holds them all.
func TestFragsMapSize(t *testing.T) {
	const inFlight = 1024
	fam := families[0]
	fe, be, client := ap(fam.node, 30104), ap(fam.pod1, 8080), ap(fam.client, 40104)
	first := binary.BigEndian.AppendUint16(nil, client.Port())
	first = binary.BigEndian.AppendUint16(first, fe.Port())
	first = binary.BigEndian.AppendUint16(first, 8+16+16)
	first = append(append(first, 0, 0), "first fragment!!"...)
	later := []byte("the later one!!!")
	for _, c := range []struct {
		name       string
		frags      uint32
		wantSize   uint32
		wantLosses bool
	}{
		{"default", 0, 16384, false},
		{"64 entries", 64, 64, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			sizes := fixtureSizes
			sizes.Frags = c.frags
			p := newProgsSized(t, loader.ConntrackTimeouts{}, sizes)
			if got := p.loaded.Maps.KprFrags.MaxEntries(); got != c.wantSize {
				t.Fatalf("kpr_frags has %d entries, want %d", got, c.wantSize)
			}
			p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, be)
			for id := uint16(1); id <= inFlight; id++ {
				if ret, _ := run(t, p.ingress, fragV4(t, client.Addr(), fe.Addr(), id, 0, true, first)); ret != actUnspec {
					t.Fatalf("first fragment of datagram %d: verdict %d", id, int32(ret))
				}
			}
			untranslated := 0
			for id := uint16(1); id <= inFlight; id++ {
				_, out := run(t, p.ingress, fragV4(t, client.Addr(), fe.Addr(), id, 3, false, later))
				if _, dst := fragAddrs(t, out, later); dst != be.Addr() {
					untranslated++
				}
			}
			s := p.stats()
			t.Logf("%d of %d later fragments untranslated; counters %+v", untranslated, inFlight, s)
			if lost := untranslated > 0; lost != c.wantLosses || s.Fragment != uint64(untranslated) {
				t.Errorf("%d of %d datagrams in flight lost their later fragment (counted %d); want losses %v",
					untranslated, inFlight, s.Fragment, c.wantLosses)
			}
		})
	}
}

// An IPv6 packet whose UDP header lies behind a routing header with
// segments left (its destination is a waypoint, not where the flow goes)
// is passed untranslated and counted.
func TestIPv6RoutingHeaderWithSegmentsLeftPassed(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[1]
	fe, be, client := ap(fam.node, 30104), ap(fam.pod1, 8080), ap(fam.client, 40104)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.UDP, be)
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 2},
		EthernetType: layers.EthernetTypeIPv6}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolIPv6Routing,
		SrcIP: client.Addr().AsSlice(), DstIP: fe.Addr().AsSlice()}
	// Next header UDP, 16 bytes after the first 8, type 4 (segment
	// routing), one segment left, and the final destination.
	rh := append([]byte{byte(layers.IPProtocolUDP), 2, 4, 1, 0, 0, 0, 0}, be.Addr().AsSlice()...)
	u := binary.BigEndian.AppendUint16(nil, client.Port())
	u = binary.BigEndian.AppendUint16(u, fe.Port())
	u = append(binary.BigEndian.AppendUint16(u, 8), 0, 0)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
		eth, ip, gopacket.Payload(append(rh, u...))); err != nil {
		t.Fatal(err)
	}
	frame := buf.Bytes()
	ret, out := run(t, p.ingress, frame)
	if ret != actUnspec || !bytes.Equal(out, frame) {
		t.Errorf("verdict %d, packet changed: %v; want passed untouched", int32(ret), !bytes.Equal(out, frame))
	}
	if s := p.stats(); s.Ipv6ExtUnparsed != 1 || s.NewFlows != 0 {
		t.Errorf("counters %+v, want the packet counted as passed for its extension header", s)
	}
}
