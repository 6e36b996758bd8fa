package tcnat

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/kpr-io/kpr/dataplane"
)

// Hand-built packets for BPF_PROG_TEST_RUN, made and read with gopacket.
// Checksums are checked here from first principles rather than with
// gopacket's own code, so a wrong incremental fix cannot hide behind a
// recomputation.

// flow is one direction of a TCP or UDP conversation.
type flow struct {
	src, dst netip.AddrPort
	proto    dataplane.Protocol
	tcpFlags string // any of "SAFR" for SYN, ACK, FIN, RST
	seq      uint32 // TCP sequence number; 0 is 1000
	ack      uint32 // TCP acknowledgment number; 0 is 2000
	empty    bool   // no payload
}

func (f flow) String() string { return fmt.Sprintf("%s %s->%s", f.proto, f.src, f.dst) }

var payload = []byte("kpr tc test payload: the bytes after the headers must come through unchanged")

// build serializes f as an Ethernet frame with valid checksums.
func build(t testing.TB, f flow) []byte {
	t.Helper()
	eth := &layers.Ethernet{
		SrcMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		DstMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 2},
	}
	var ip gopacket.NetworkLayer
	var ipLayer gopacket.SerializableLayer
	if f.src.Addr().Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		v4 := &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Flags: layers.IPv4DontFragment,
			Protocol: layers.IPProtocol(f.proto), SrcIP: f.src.Addr().AsSlice(), DstIP: f.dst.Addr().AsSlice()}
		ip, ipLayer = v4, v4
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		v6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(f.proto),
			SrcIP: f.src.Addr().AsSlice(), DstIP: f.dst.Addr().AsSlice()}
		ip, ipLayer = v6, v6
	}
	var l4 gopacket.SerializableLayer
	switch f.proto {
	case dataplane.TCP:
		seq := f.seq
		if seq == 0 {
			seq = 1000
		}
		ack := f.ack
		if ack == 0 {
			ack = 2000
		}
		tcp := &layers.TCP{SrcPort: layers.TCPPort(f.src.Port()), DstPort: layers.TCPPort(f.dst.Port()),
			Seq: seq, Ack: ack, Window: 65535}
		for _, c := range f.tcpFlags {
			switch c {
			case 'S':
				tcp.SYN = true
			case 'A':
				tcp.ACK = true
			case 'F':
				tcp.FIN = true
			case 'R':
				tcp.RST = true
			}
		}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		l4 = tcp
	case dataplane.UDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(f.src.Port()), DstPort: layers.UDPPort(f.dst.Port())}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		l4 = udp
	default:
		t.Fatalf("build: protocol %s", f.proto)
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	body := payload
	if f.empty {
		body = nil
	}
	if err := gopacket.SerializeLayers(buf, opts, eth, ipLayer, l4, gopacket.Payload(body)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// parsed is what a program's output packet says.
type parsed struct {
	flow
	payload []byte
}

// parse decodes frame and fails the test unless every checksum in it
// validates.
func parse(t testing.TB, frame []byte) parsed {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		t.Fatalf("output packet does not decode: %v", el.Error())
	}
	var out parsed
	var pseudo []byte
	var l4 []byte
	switch ip := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		hdr := ip.Contents
		if sum := onesSum(hdr, 0); sum != 0xffff {
			t.Errorf("IPv4 header checksum does not validate (sum %#04x, field %#04x)", sum, ip.Checksum)
		}
		src, _ := netip.AddrFromSlice(ip.SrcIP)
		dst, _ := netip.AddrFromSlice(ip.DstIP)
		out.src, out.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
		out.proto = dataplane.Protocol(ip.Protocol)
		l4 = ip.Payload
		pseudo = append(append(append([]byte{}, ip.SrcIP.To4()...), ip.DstIP.To4()...), 0, byte(ip.Protocol))
		pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(l4)))
	case *layers.IPv6:
		src, _ := netip.AddrFromSlice(ip.SrcIP)
		dst, _ := netip.AddrFromSlice(ip.DstIP)
		out.src, out.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
		out.proto = dataplane.Protocol(ip.NextHeader)
		l4 = ip.Payload
		pseudo = append(append([]byte{}, ip.SrcIP.To16()...), ip.DstIP.To16()...)
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(l4)))
		pseudo = append(pseudo, 0, 0, 0, byte(ip.NextHeader))
	default:
		t.Fatalf("output packet has no IP layer: %v", pkt)
	}
	if sum := onesSum(l4, onesSum(pseudo, 0)); sum != 0xffff {
		t.Errorf("%s checksum does not validate (sum %#04x)", out.proto, sum)
	}
	switch l := pkt.TransportLayer().(type) {
	case *layers.TCP:
		out.src = netip.AddrPortFrom(out.src.Addr(), uint16(l.SrcPort))
		out.dst = netip.AddrPortFrom(out.dst.Addr(), uint16(l.DstPort))
		out.payload = l.Payload
	case *layers.UDP:
		out.src = netip.AddrPortFrom(out.src.Addr(), uint16(l.SrcPort))
		out.dst = netip.AddrPortFrom(out.dst.Addr(), uint16(l.DstPort))
		out.payload = l.Payload
	default:
		t.Fatalf("output packet has no TCP or UDP layer: %v", pkt)
	}
	return out
}

// onesSum is the Internet checksum's ones'-complement sum of b, added to
// start (RFC 1071). A header whose checksum is right sums to 0xffff.
func onesSum(b []byte, start uint16) uint16 {
	sum := uint32(start)
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}
