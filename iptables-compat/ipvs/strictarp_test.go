package ipvs

import (
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kpr-io/kpr/tests/harness"
)

// --ipvs-strict-arp, with real ARP: a Service address bound to an
// interface of the node other than its bridge, and a neighbour on the node's bridge asking who has it. The
// node answers without strict ARP (the kernel answers for any of its
// addresses on any link) and stays silent with it. It needs no IPVS: the
// ARP sysctls are set whether or not the kernel has ip_vs.
func TestStrictARPKeepsServiceAddressesOffTheLink(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("skipping: needs root for network namespaces of its own, and not under -short")
	}
	for _, strict := range []bool{false, true} {
		name := "default"
		if strict {
			name = "strict"
		}
		t.Run(name, func(t *testing.T) {
			if got, want := answersARP(t, strict), !strict; got != want {
				t.Errorf("the node answered ARP for a Service address on its bridge: %v, want %v (strict ARP %v)", got, want, strict)
			}
		})
	}
}

// answersARP reports whether a pod on the node's bridge learns a MAC for
// a Service address bound to another interface of the node, after
// SetSysctls(strict) in the node's namespace.
func answersARP(t *testing.T, strict bool) bool {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := node.AddPod("neighbour")
	if err != nil {
		t.Fatal(err)
	}
	// The node's uplink stands in for the dummy interface (not every
	// kernel has the dummy module): what matters is that the address is
	// on another interface than the one the question arrives on.
	vip := netip.MustParseAddr("10.96.0.1")
	if err := node.AddAddress(netip.PrefixFrom(vip, 32)); err != nil {
		t.Fatal(err)
	}
	if err := harness.Do(node.NetNS, func() error {
		// The IPVS settings fail on a kernel without ip_vs; the ARP
		// ones must be set all the same.
		if err := SetSysctls(strict); err != nil {
			t.Logf("SetSysctls(%v): %v", strict, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The pod takes the Service range as on its link, so it asks for the
	// address itself, as a router on the node's segment would.
	eth, err := pod.NetNS.Netlink().LinkByIndex(pod.EthIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := pod.NetNS.Netlink().RouteAdd(&netlink.Route{LinkIndex: pod.EthIndex, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: net.IPv4(10, 96, 0, 0), Mask: net.CIDRMask(12, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := harness.Do(pod.NetNS, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(vip, 9)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("who has it"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		neighs, err := pod.NetNS.Netlink().NeighList(eth.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range neighs {
			if n.IP.Equal(vip.AsSlice()) && len(n.HardwareAddr) > 0 &&
				n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
