package tcnat

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// A second client outside the node, on the same link: the address the
// tests keep outside loadBalancerSourceRanges.
var outsiderAddrs = []netip.Prefix{netip.MustParsePrefix("192.168.100.3/24"), netip.MustParsePrefix("fd00:100::3/64")}

// addOutsider gives the client namespace the outsider's addresses.
func (top *topology) addOutsider(t *testing.T) {
	t.Helper()
	nl := top.client.NetNS.Netlink()
	wire, err := nl.LinkByName(extDev + "-wire")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range outsiderAddrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
		if a.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := nl.AddrAdd(wire, addr); err != nil {
			t.Fatal(err)
		}
	}
}

// whoFrom is harness.WhoTCP from the source address src.
func whoFrom(ns *harness.NetNS, src netip.Addr, fe netip.AddrPort, timeout time.Duration) (string, error) {
	var c net.Conn
	err := harness.Do(ns, func() error {
		var err error
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		c, err = d.Dial("tcp", fe.String())
		return err
	})
	if err != nil {
		return "", fmt.Errorf("dial %s from %s: %w", fe, src, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("greeting of %s to %s: %w", fe, src, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

func clientAddr(v6 bool) netip.Addr {
	if v6 {
		return clientAddrs[1].Addr()
	}
	return clientAddrs[0].Addr()
}

func outsiderAddr(v6 bool) netip.Addr {
	if v6 {
		return outsiderAddrs[1].Addr()
	}
	return outsiderAddrs[0].Addr()
}

// loadBalancer is a LoadBalancer Service port through the eBPF backend,
// as the control plane hands it over: a LoadBalancer IP and a NodePort,
// both served by the given backends, and source ranges.
func loadBalancer(name string, lbIP, nodePort netip.AddrPort, backends []netip.AddrPort, ranges ...netip.Prefix) *dataplane.ServicePort {
	var bs []dataplane.Backend
	for _, b := range backends {
		bs = append(bs, dataplane.Backend{Addr: b.Addr(), Port: b.Port()})
	}
	return &dataplane.ServicePort{
		Name:         dataplane.ServicePortName{Namespace: "tcnat", Name: name, Protocol: dataplane.TCP},
		SourceRanges: ranges,
		Frontends: []dataplane.Frontend{
			{Addr: nodePort.Addr(), Port: nodePort.Port(), Protocol: dataplane.TCP, Kind: dataplane.NodePort, Backends: bs},
			{Addr: lbIP.Addr(), Port: lbIP.Port(), Protocol: dataplane.TCP, Kind: dataplane.LoadBalancer, Backends: bs},
		},
	}
}

// loadBalancerSourceRanges from outside: a client inside the ranges is
// served on the LoadBalancer IP, one outside them is dropped there (and
// counted), and still served on the same Service's NodePort, which the
// ranges do not restrict, as in kube-proxy. Once the ranges go, the
// outsider is served too, and the source-range map is empty again.
func TestLoadBalancerSourceRangesFromOutside(t *testing.T) {
	top := newTopology(t, 1, loader.TCAttachAuto)
	top.addOutsider(t)
	plane := ebpfplane.New(top.lb, zaptest.NewLogger(t))
	if err := plane.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			lbIP := netip.MustParseAddrPort("203.0.113.9:80")
			if fam.v6 {
				lbIP = netip.MustParseAddrPort("[2001:db8::9]:80")
			}
			nodePort := netip.AddrPortFrom(nodeAddr(fam.v6), 30095)
			inside, outside := clientAddr(fam.v6), outsiderAddr(fam.v6)
			backends := top.backends(lbIP.Addr(), dataplane.TCP, top.pods...)
			// A range of the other family too: it must not open or
			// close this family's frontend.
			other := netip.MustParsePrefix("2001:db8:ffff::/48")
			if fam.v6 {
				other = netip.MustParsePrefix("198.18.0.0/15")
			}
			sp := loadBalancer("fenced-"+fam.name, lbIP, nodePort, backends, netip.PrefixFrom(inside, inside.BitLen()), other)
			if err := plane.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
				t.Fatal(err)
			}
			before := top.stats().DropSourceRange
			if who, err := whoFrom(top.client.NetNS, inside, lbIP, 3*time.Second); err != nil || who != top.pods[0].Name {
				t.Errorf("%s from %s (inside the ranges) = %q, %v; want %s", lbIP, inside, who, err, top.pods[0].Name)
			}
			if who, err := whoFrom(top.client.NetNS, outside, lbIP, time.Second); err == nil {
				t.Errorf("%s from %s (outside the ranges) reached %s, want it dropped", lbIP, outside, who)
			}
			if got := top.stats().DropSourceRange; got <= before {
				t.Errorf("drop_source_range went from %d to %d, want the outsider's SYNs counted", before, got)
			}
			if who, err := whoFrom(top.client.NetNS, outside, nodePort, 3*time.Second); err != nil || who != top.pods[0].Name {
				t.Errorf("NodePort %s from %s = %q, %v; want %s: the ranges restrict LoadBalancer IPs only", nodePort, outside, who, err, top.pods[0].Name)
			}

			open := loadBalancer(sp.Name.Name, lbIP, nodePort, backends)
			if err := plane.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: open}); err != nil {
				t.Fatal(err)
			}
			if who, err := whoFrom(top.client.NetNS, outside, lbIP, 3*time.Second); err != nil || who != top.pods[0].Name {
				t.Errorf("without ranges, %s from %s = %q, %v; want %s", lbIP, outside, who, err, top.pods[0].Name)
			}
			if vips := top.lb.SourceRanges().VIPs(); len(vips) != 0 {
				t.Errorf("source ranges left in the map for %v after the Service dropped them", vips)
			}
		})
	}
}
