package tcnat

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
)

// buildICMPError serializes an ICMP error from src to dst quoting the IP
// header and first 8 bytes of TCP of the packet q: fragmentation needed
// (IPv4) or packet too big (IPv6), with MTU 1280.
func buildICMPError(t testing.TB, src, dst netip.Addr, q flow) []byte {
	t.Helper()
	quoted := build(t, q)[14:] // without Ethernet
	ihl := 40
	if q.src.Addr().Is4() {
		ihl = int(quoted[0]&0x0f) * 4
	}
	quoted = quoted[:ihl+8]
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 3}, DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 4}}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	var err error
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, layers.ICMPv4CodeFragmentationNeeded), Seq: 1280}
		err = gopacket.SerializeLayers(buf, opts, eth, ip, icmp, gopacket.Payload(quoted))
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)}
		if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		body := binary.BigEndian.AppendUint32(nil, 1280)
		err = gopacket.SerializeLayers(buf, opts, eth, ip, icmp, gopacket.Payload(append(body, quoted...)))
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// icmpError is what a program's output ICMP error says.
type icmpError struct {
	src, dst netip.Addr // of the ICMP message
	quoted   flow       // the quoted packet's addresses and ports
}

// parseICMPError decodes frame and fails the test unless the ICMP checksum
// and the quoted IPv4 header checksum validate.
func parseICMPError(t testing.TB, frame []byte) icmpError {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	var out icmpError
	var msg, pseudo []byte
	switch ip := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		if onesSum(ip.Contents, 0) != 0xffff {
			t.Errorf("IPv4 header checksum of the ICMP error does not validate")
		}
		out.src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
		out.dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
		msg = ip.Payload
	case *layers.IPv6:
		out.src, _ = netip.AddrFromSlice(ip.SrcIP)
		out.dst, _ = netip.AddrFromSlice(ip.DstIP)
		msg = ip.Payload
		pseudo = append(append([]byte{}, ip.SrcIP.To16()...), ip.DstIP.To16()...)
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(msg)))
		pseudo = append(pseudo, 0, 0, 0, byte(layers.IPProtocolICMPv6))
	default:
		t.Fatalf("no IP layer: %v", pkt)
	}
	if onesSum(msg, onesSum(pseudo, 0)) != 0xffff {
		t.Errorf("ICMP checksum does not validate")
	}
	q := msg[8:]
	var l4 []byte
	if out.src.Is4() {
		ihl := int(q[0]&0x0f) * 4
		if onesSum(q[:ihl], 0) != 0xffff {
			t.Errorf("the quoted IPv4 header's checksum does not validate")
		}
		s, _ := netip.AddrFromSlice(q[12:16])
		d, _ := netip.AddrFromSlice(q[16:20])
		out.quoted.src, out.quoted.dst = netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, 0)
		out.quoted.proto = dataplane.Protocol(q[9])
		l4 = q[ihl:]
	} else {
		s, _ := netip.AddrFromSlice(q[8:24])
		d, _ := netip.AddrFromSlice(q[24:40])
		out.quoted.src, out.quoted.dst = netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, 0)
		out.quoted.proto = dataplane.Protocol(q[6])
		l4 = q[40:]
	}
	out.quoted.src = netip.AddrPortFrom(out.quoted.src.Addr(), binary.BigEndian.Uint16(l4))
	out.quoted.dst = netip.AddrPortFrom(out.quoted.dst.Addr(), binary.BigEndian.Uint16(l4[2:]))
	return out
}

// ICMP errors about a translated flow are translated with it, so that path
// MTU discovery works through a NodePort: toward the client, the quoted
// packet is the one the client sent (to the frontend); toward the backend,
// the one the backend sent (from itself). Both checksums stay valid.
func TestICMPErrorsFollowTheTranslation(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	routers := map[string]netip.Addr{"IPv4": netip.MustParseAddr("192.168.100.1"), "IPv6": netip.MustParseAddr("fd00:100::1")}
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			p.t = t
			fe, be := ap(fam.node, 30086), ap(fam.pod1, 8080)
			p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, be)
			req := flow{src: ap(fam.client, 40010), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}
			p.in(req)
			asSent := flow{src: req.src, dst: be, proto: dataplane.TCP}

			// The node's own forwarding toward the pod: fragmentation needed.
			ret, out := run(t, p.egress, buildICMPError(t, fam.node, fam.client, asSent))
			got := parseICMPError(t, out)
			if ret != actUnspec || got.quoted.src != req.src || got.quoted.dst != fe || got.src != fam.node {
				t.Errorf("node's error toward the client quotes %s->%s from %s, want %s->%s from %s",
					got.quoted.src, got.quoted.dst, got.src, req.src, fe, fam.node)
			}
			// The backend's own error leaves from the frontend too.
			_, out = run(t, p.egress, buildICMPError(t, fam.pod1, fam.client, asSent))
			if got := parseICMPError(t, out); got.src != fam.node || got.quoted.dst != fe {
				t.Errorf("backend's error leaves from %s quoting %s, want from %s quoting %s", got.src, got.quoted.dst, fam.node, fe)
			}
			// A router on the way to the client, about a reply.
			reply := flow{src: fe, dst: req.src, proto: dataplane.TCP}
			ret, out = run(t, p.ingress, buildICMPError(t, routers[fam.name], fe.Addr(), reply))
			got = parseICMPError(t, out)
			if ret != actUnspec || got.dst != be.Addr() || got.quoted.src != be || got.quoted.dst != req.src {
				t.Errorf("router's error goes to %s quoting %s->%s, want to %s quoting %s->%s",
					got.dst, got.quoted.src, got.quoted.dst, be.Addr(), be, req.src)
			}
			// An error about a flow kpr does not know passes untouched.
			other := flow{src: ap(fam.client, 40011), dst: ap(fam.pod2, 22), proto: dataplane.TCP}
			frame := buildICMPError(t, fam.node, fam.client, other)
			if _, out := run(t, p.egress, frame); string(out) != string(frame) {
				t.Errorf("an unrelated ICMP error was changed")
			}
		})
	}
	if s := p.stats(); s.IcmpTranslated != 6 {
		t.Errorf("counters %+v, want 6 ICMP errors translated", s)
	}
}

// ICMP errors about a SNATed flow (its backend on another node) are
// translated too: one from the client's side goes to the backend about the
// packet it sent (to the node's SNAT port), one from the backend's side goes
// to the client about the packet it sent (to the frontend). The flow's
// entries are written by hand, as the SNAT path needs real routes.
func TestICMPErrorsOfSNATedFlows(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	routers := map[string]netip.Addr{"IPv4": netip.MustParseAddr("192.168.100.1"), "IPv6": netip.MustParseAddr("fd00:100::1")}
	const snatFlag, repliedFlag = 8, 1 // CT_F_SNAT, CT_F_REPLIED (bpf/types.h)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			p.t = t
			client, fe, be, snat := ap(fam.client, 40020), ap(fam.node, 30088), ap(fam.pod2, 8080), ap(fam.node, 61500)
			expires := monotonicNow(t) + uint64(100*time.Second)
			fwdKey := bpf.KprCtKey{Saddr: addr16(client.Addr()), Daddr: addr16(fe.Addr()), Sport: htons(client.Port()), Dport: htons(fe.Port()), Proto: uint8(dataplane.TCP)}
			fwd := bpf.KprCtValue{ExpiresNs: expires, Addr: addr16(be.Addr()), Port: htons(be.Port()),
				NatAddr: addr16(snat.Addr()), NatPort: htons(snat.Port()), Flags: snatFlag | repliedFlag}
			revKey := bpf.KprCtKey{Saddr: addr16(be.Addr()), Daddr: addr16(snat.Addr()), Sport: htons(be.Port()), Dport: htons(snat.Port()), Proto: uint8(dataplane.TCP), Dir: 1}
			rev := bpf.KprCtValue{ExpiresNs: expires, Addr: addr16(fe.Addr()), Port: htons(fe.Port()),
				NatAddr: addr16(client.Addr()), NatPort: htons(client.Port()), Flags: snatFlag}
			ct := p.loaded.Maps.KprConntrack
			if err := ct.Put(&fwdKey, &fwd); err != nil {
				t.Fatal(err)
			}
			if err := ct.Put(&revKey, &rev); err != nil {
				t.Fatal(err)
			}

			// From the client's side, about the reply kpr sent.
			_, out := run(t, p.ingress, buildICMPError(t, routers[fam.name], fe.Addr(), flow{src: fe, dst: client, proto: dataplane.TCP}))
			got := parseICMPError(t, out)
			if got.dst != be.Addr() || got.quoted.src != be || got.quoted.dst != snat {
				t.Errorf("client-side error goes to %s quoting %s->%s, want to %s quoting %s->%s",
					got.dst, got.quoted.src, got.quoted.dst, be.Addr(), be, snat)
			}
			// From the backend's side, about the packet kpr sent it.
			_, out = run(t, p.ingress, buildICMPError(t, fam.pod1, snat.Addr(), flow{src: snat, dst: be, proto: dataplane.TCP}))
			got = parseICMPError(t, out)
			if got.dst != client.Addr() || got.quoted.src != client || got.quoted.dst != fe {
				t.Errorf("backend-side error goes to %s quoting %s->%s, want to %s quoting %s->%s",
					got.dst, got.quoted.src, got.quoted.dst, client.Addr(), client, fe)
			}
		})
	}
}
