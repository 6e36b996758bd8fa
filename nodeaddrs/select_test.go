package nodeaddrs

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

func addrs(ips ...string) []Addr {
	var out []Addr
	for _, ip := range ips {
		out = append(out, Addr{IP: netip.MustParseAddr(ip)})
	}
	return out
}

// A node as most CNIs leave it: the rule picks the uplinks that carry
// addresses, and none of the pod, overlay and bridge devices.
func TestSelectNativeDevices(t *testing.T) {
	links := []Link{
		{Name: "lo", Index: 1, Kind: "device", Up: true, Loopback: true, Addrs: addrs("127.0.0.1", "::1")},
		{Name: "eth0", Index: 2, Kind: "device", Up: true, Addrs: addrs("192.0.2.10", "fe80::1", "2001:db8::10")},
		{Name: "eth1", Index: 3, Kind: "device", Up: true, Addrs: addrs("198.51.100.10")},
		{Name: "eth2", Index: 4, Kind: "device", Up: false, Addrs: addrs("203.0.113.10")},
		{Name: "eth3", Index: 5, Kind: "device", Up: true, Addrs: addrs("fe80::3")}, // link-local only
		{Name: "cni0", Index: 6, Kind: "bridge", Up: true, Addrs: addrs("10.244.0.1")},
		{Name: "vethab12", Index: 7, Kind: "veth", Up: true, HasMaster: true},
		{Name: "veth-ptp", Index: 8, Kind: "veth", Up: true, Addrs: addrs("10.244.0.1")}, // a ptp CNI's pod veth
		{Name: "lxc1234", Index: 9, Kind: "veth", Up: true, DefaultRoute: true, Addrs: addrs("10.0.0.9")},
		{Name: "flannel.1", Index: 10, Kind: "vxlan", Up: true, Addrs: addrs("10.244.0.0")},
		{Name: "docker0", Index: 11, Kind: "bridge", Up: true, Addrs: addrs("172.17.0.1")},
		{Name: "bond0", Index: 12, Kind: "bond", Up: true, Addrs: addrs("192.0.2.20")},
		{Name: "ens5", Index: 13, Kind: "device", Up: true, HasMaster: true},
		{Name: "eth4", Index: 14, Kind: "device", Up: true, Addrs: []Addr{{IP: netip.MustParseAddr("2001:db8::14"), Tentative: true}}},
	}
	got := Select(links, nil, nil)
	want := State{
		Devices: []Device{{"bond0", 12}, {"eth0", 2}, {"eth1", 3}},
		Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.20"),
			netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("2001:db8::10")},
	}
	if !got.Equal(want) {
		t.Errorf("Select = %+v, want %+v", got, want)
	}
}

// A node whose uplink is a veth (a container, a kind node) routes its
// default route through it; that veth counts.
func TestSelectVethWithDefaultRoute(t *testing.T) {
	links := []Link{
		{Name: "eth0", Index: 5, Kind: "veth", Up: true, DefaultRoute: true, Addrs: addrs("172.18.0.2")},
		{Name: "veth1", Index: 6, Kind: "veth", Up: true, Addrs: addrs("10.244.1.1")},
	}
	if got := Select(links, nil, nil).DeviceNames(); !slices.Equal(got, []string{"eth0"}) {
		t.Errorf("devices %v, want [eth0]", got)
	}
}

// Named devices are taken as they are, the rule aside; their addresses
// serve NodePorts.
func TestSelectNamedDevices(t *testing.T) {
	links := []Link{
		{Name: "eth0", Index: 2, Kind: "device", Up: true, Addrs: addrs("192.0.2.10")},
		{Name: "br0", Index: 3, Kind: "bridge", Up: false, Addrs: addrs("198.51.100.1")},
	}
	got := Select(links, []string{"br0", "missing"}, nil)
	if !slices.Equal(got.DeviceNames(), []string{"br0"}) || !slices.Equal(got.Addrs, []netip.Addr{netip.MustParseAddr("198.51.100.1")}) {
		t.Errorf("Select with --devices br0,missing = %+v, want br0 and its address", got)
	}
}

// A device recreated under its name must be attached again.
func TestStateEqualSeesNewIndex(t *testing.T) {
	a := State{Devices: []Device{{"eth0", 2}}}
	b := State{Devices: []Device{{"eth0", 7}}}
	if a.Equal(b) {
		t.Error("states with eth0 at two indexes are equal")
	}
}

func TestLinkUp(t *testing.T) {
	for _, tc := range []struct {
		flags net.Flags
		oper  netlink.LinkOperState
		want  bool
	}{
		{net.FlagUp, netlink.OperUp, true},
		{net.FlagUp, netlink.OperUnknown, true}, // dummy, tun
		{net.FlagUp, netlink.OperLowerLayerDown, false},
		{net.FlagUp, netlink.OperDown, false},
		{0, netlink.OperUp, false},
	} {
		if got := linkUp(tc.flags, tc.oper); got != tc.want {
			t.Errorf("linkUp(%v, %v) = %v, want %v", tc.flags, tc.oper, got, tc.want)
		}
	}
}

// A device without an Ethernet header is never used, named or not, and the
// state says so.
func TestSelectLeavesOutHeaderlessDevices(t *testing.T) {
	links := []Link{
		{Name: "eth0", Index: 2, Kind: "device", Up: true, Addrs: addrs("192.0.2.10")},
		{Name: "wg0", Index: 3, Kind: "wireguard", Up: true, Headerless: true, Addrs: addrs("10.8.0.1")},
		{Name: "tun0", Index: 4, Kind: "tun", Up: true, Headerless: true, DefaultRoute: true, Addrs: addrs("198.51.100.9")},
	}
	for _, named := range [][]string{nil, {"eth0", "tun0", "wg0"}} {
		got := Select(links, named, nil)
		if !slices.Equal(got.DeviceNames(), []string{"eth0"}) || !slices.Equal(got.Addrs, []netip.Addr{netip.MustParseAddr("192.0.2.10")}) {
			t.Errorf("--devices %v: Select = %+v, want eth0 and its address only", named, got)
		}
		if !slices.Equal(got.HeaderlessNames(), []string{"tun0", "wg0"}) {
			t.Errorf("--devices %v: headerless devices %v, want [tun0 wg0]", named, got.HeaderlessNames())
		}
	}
}

// A device that carries the Node object's InternalIP or ExternalIP is the
// node's, whatever its kind or name: a veth uplink without a default route,
// a bridge holding the uplink. It must still be up and usable.
func TestSelectDeviceWithNodeIP(t *testing.T) {
	links := []Link{
		{Name: "eth0", Index: 5, Kind: "veth", Up: true, Addrs: addrs("172.18.0.2")},
		{Name: "br0", Index: 6, Kind: "bridge", Up: true, Addrs: addrs("2001:db8::2")},
		{Name: "veth1", Index: 7, Kind: "veth", Up: true, Addrs: addrs("10.244.1.1")},
		{Name: "eth1", Index: 8, Kind: "veth", Up: false, Addrs: addrs("192.0.2.8")},
		{Name: "wg0", Index: 9, Kind: "wireguard", Up: true, Headerless: true, Addrs: addrs("10.8.0.1")},
	}
	if got := Select(links, nil, nil).DeviceNames(); len(got) != 0 {
		t.Errorf("without the Node's addresses: devices %v, want none", got)
	}
	nodeIPs := []netip.Addr{netip.MustParseAddr("172.18.0.2"), netip.MustParseAddr("2001:db8::2"),
		netip.MustParseAddr("192.0.2.8"), netip.MustParseAddr("10.8.0.1")}
	got := Select(links, nil, nodeIPs)
	if !slices.Equal(got.DeviceNames(), []string{"br0", "eth0"}) {
		t.Errorf("with the Node's addresses: devices %v, want [br0 eth0] (eth1 is down, wg0 headerless)", got.DeviceNames())
	}
	if !slices.Equal(got.HeaderlessNames(), []string{"wg0"}) {
		t.Errorf("headerless %v, want [wg0]", got.HeaderlessNames())
	}
}
