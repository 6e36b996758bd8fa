package tcnat

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// Frames no well-behaved client sends, put on the wire as they are: a raw
// packet socket on the client's end of the node's external device writes
// them, so they reach the tc programs as any frame from a neighbour does,
// with neither side's IP stack in the way.

// sendRaw writes frame (from build) out of the client's end of the cable,
// addressed to the node's external device.
func (top *topology) sendRaw(t *testing.T, frame []byte) {
	t.Helper()
	wire, err := top.client.NetNS.Netlink().LinkByName(extDev + "-wire")
	if err != nil {
		t.Fatal(err)
	}
	ext, err := top.node.NetNS.Netlink().LinkByName(extDev)
	if err != nil {
		t.Fatal(err)
	}
	copy(frame[0:6], ext.Attrs().HardwareAddr)
	copy(frame[6:12], wire.Attrs().HardwareAddr)
	err = harness.Do(top.client.NetNS, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: wire.Attrs().Index})
	})
	if err != nil {
		t.Fatalf("send a raw frame from the client: %v", err)
	}
}

// waitStat waits until the counter read rises above before.
func (top *topology) waitStat(read func() uint64, before uint64) bool {
	return eventually(2*time.Second, func() bool { return read() > before })
}

// A frame from the wire to a loopback NodePort (127.0.0.1, ::1) is dropped
// and counted, as the kernel drops a martian destination, instead of being
// translated to a backend: tc runs before the kernel's check, so kpr must
// make it itself. The node's own sockets still reach the loopback NodePort
// through the socket hooks, which this does not touch.
func TestLoopbackFromTheWireDropped(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	for _, lo := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
		t.Run(lo.String(), func(t *testing.T) {
			fe := netip.AddrPortFrom(lo, 30090)
			top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(lo, dataplane.TCP, top.pods...)...)
			client := clientAddrs[0].Addr()
			if lo.Is6() {
				client = clientAddrs[1].Addr()
			}
			before := top.stats()
			top.sendRaw(t, build(t, flow{src: netip.AddrPortFrom(client, 40001), dst: fe, proto: dataplane.TCP, tcpFlags: "S"}))
			if !top.waitStat(func() uint64 { return top.stats().DropLoopback }, before.DropLoopback) {
				t.Errorf("a SYN from the wire to %s was not counted as dropped (drop_loopback %d)", fe, top.stats().DropLoopback)
			}
			if after := top.stats(); after.Translated != before.Translated || after.NewFlows != before.NewFlows {
				t.Errorf("a SYN from the wire to %s was translated (translated %d -> %d, new flows %d -> %d)",
					fe, before.Translated, after.Translated, before.NewFlows, after.NewFlows)
			}
		})
	}
}

// An IPv6 frame to ::ffff:a.b.c.d never finds the IPv4 frontend a.b.c.d,
// though the maps key both families by 16 bytes: it is passed (counted)
// and no flow is made, whether its source is an IPv6 address or an IPv4
// client's in the v4-mapped form (how the maps key IPv4 flows and source
// ranges).
func TestV4MappedIPv6NeverMatchesIPv4(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	fe := netip.AddrPortFrom(nodeAddrs[0].Addr(), 30091)
	top.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, top.backends(fe.Addr(), dataplane.TCP, top.pods...)...)
	mapped := netip.AddrPortFrom(netip.AddrFrom16(fe.Addr().As16()), fe.Port())
	for _, f := range []flow{
		// From the client's own IPv6 address.
		{src: netip.AddrPortFrom(clientAddrs[1].Addr(), 40002), dst: mapped, proto: dataplane.TCP, tcpFlags: "S"},
		// As an IPv4 client would be keyed, which is how an IPv4 flow's
		// conntrack entry names it too.
		{src: netip.AddrPortFrom(netip.AddrFrom16(clientAddrs[0].Addr().As16()), 40003), dst: mapped, proto: dataplane.TCP, tcpFlags: "S"},
	} {
		t.Run(f.src.Addr().String(), func(t *testing.T) {
			before := top.stats()
			top.sendRaw(t, build(t, f))
			if !top.waitStat(func() uint64 { return top.stats().V4Mapped }, before.V4Mapped) {
				t.Errorf("%s: not counted as v4-mapped (v4_mapped %d)", f, top.stats().V4Mapped)
			}
			if after := top.stats(); after.Translated != before.Translated || after.NewFlows != before.NewFlows {
				t.Errorf("%s matched the IPv4 frontend %s (translated %d -> %d, new flows %d -> %d)",
					f, fe, before.Translated, after.Translated, before.NewFlows, after.NewFlows)
			}
		})
	}
	// The IPv4 frontend itself still works from the same client.
	if _, err := harness.WhoTCP(top.client.NetNS, fe, 3*time.Second); err != nil {
		t.Fatalf("TCP to NodePort %s from outside: %v", fe, err)
	}
}
