// Package nodeaddrs finds the node's devices and addresses for the tc
// programs, and follows them while kpr runs: which devices the programs
// attach to, and which local addresses serve NodePorts.
//
// # The rule
//
// Without --devices, a device is one of the node's own (a "native device",
// as Cilium calls them) when all of these hold:
//
//   - it is up: administratively up, and its operational state is not down
//     (dummy and tun devices report "unknown", which counts as up);
//   - it is not a loopback device;
//   - it has no master: ports of a bridge, bond or VRF carry their
//     traffic through the master;
//   - its name does not start with a prefix of a CNI's or container
//     runtime's devices (excludedPrefixes: lxc, cali, cilium_, cni,
//     docker, flannel, ...);
//   - it is not a bridge, Open vSwitch, VXLAN or Geneve device: bridges hold
//     pods, tunnels carry overlay traffic between nodes, neither carries
//     traffic from outside the cluster;
//   - a veth only counts if a default route leaves through it: most CNIs
//     give every pod a veth whose host end may carry an address, while a
//     node whose uplink is a veth (a container, a kind node) routes its
//     default route through it;
//   - the last three (names, kinds and veths) do not apply to a device that
//     carries one of the Node object's InternalIP or ExternalIP addresses:
//     that is the node's device whatever it is, such as a veth uplink
//     without a default route, or a bridge that holds the uplink;
//   - it carries a node address: a unicast address that is neither
//     loopback nor link-local, nor still tentative (IPv6 duplicate address
//     detection).
//
// With --devices, the named devices are used as they are, and their
// addresses are the node addresses.
//
// Either way a device whose frames have no Ethernet header (WireGuard,
// tun, ipip, gre, sit: any hardware type but Ethernet) is left out and
// listed in State.Headerless: the tc programs read a 14-byte Ethernet
// header before the IP one, and on such a device would misread every
// packet.
package nodeaddrs

import (
	"net/netip"
	"slices"
	"strings"
)

// excludedPrefixes start the names of devices that CNIs and container
// runtimes create for pods, overlays and their own plumbing.
var excludedPrefixes = []string{"lxc", "cali", "cilium_", "cni", "docker", "flannel", "weave", "vxlan", "genev",
	"kube-ipvs", "nodelocaldns", "tunl", "virbr"}

// excludedKinds are link kinds (netlink's Type()) that never face outside.
var excludedKinds = []string{"bridge", "openvswitch", "vxlan", "geneve"}

// Link is what the rule needs to know about one device.
type Link struct {
	Name  string
	Index int
	// Kind is the link type netlink reports: "device", "veth", "bridge",
	// "dummy", ...
	Kind     string
	Up       bool
	Loopback bool
	// HasMaster says the device is a port of another (bridge, bond, VRF).
	HasMaster bool
	// DefaultRoute says a default route (IPv4 or IPv6) leaves through it.
	DefaultRoute bool
	// Headerless says its frames start with the IP header: its hardware
	// type is not Ethernet (WireGuard and tun: none; ipip, gre, sit).
	Headerless bool
	Addrs      []Addr
}

// Addr is one address on a device.
type Addr struct {
	IP netip.Addr
	// Tentative is an IPv6 address that duplicate address detection has
	// not cleared yet (or has failed): the node cannot use it.
	Tentative bool
}

// Device is a device the tc programs attach to.
type Device struct {
	Name  string
	Index int
}

// State is the node's devices and the addresses that serve NodePorts.
type State struct {
	// Devices are sorted by name.
	Devices []Device
	// Addrs are the node addresses on Devices, sorted and unique.
	Addrs []netip.Addr
	// Headerless are the devices the rule (or --devices) would have
	// taken but that have no Ethernet header, which the tc programs need;
	// sorted by name.
	Headerless []Device
}

// DeviceNames lists the devices' names.
func (s State) DeviceNames() []string { return names(s.Devices) }

// HeaderlessNames lists the names of the devices left out for want of an
// Ethernet header.
func (s State) HeaderlessNames() []string { return names(s.Headerless) }

func names(devices []Device) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.Name)
	}
	return out
}

// Equal reports whether two states attach and serve alike. A device that
// was recreated under its name has another index, and needs attaching
// again.
func (s State) Equal(o State) bool {
	return slices.Equal(s.Devices, o.Devices) && slices.Equal(s.Addrs, o.Addrs) && slices.Equal(s.Headerless, o.Headerless)
}

// Select applies the rule to links. Non-empty named are the devices the
// operator named: those that exist are used whatever the rule says.
// nodeIPs are the Node object's InternalIP and ExternalIP addresses (none
// before kpr has read it).
func Select(links []Link, named []string, nodeIPs []netip.Addr) State {
	var s State
	for _, l := range links {
		addrs := nodeAddrs(l.Addrs)
		if len(named) > 0 {
			if !slices.Contains(named, l.Name) {
				continue
			}
		} else if len(addrs) == 0 || !native(l, addrs, nodeIPs) {
			continue
		}
		if l.Headerless {
			s.Headerless = append(s.Headerless, Device{Name: l.Name, Index: l.Index})
			continue
		}
		s.Devices = append(s.Devices, Device{Name: l.Name, Index: l.Index})
		s.Addrs = append(s.Addrs, addrs...)
	}
	byName := func(a, b Device) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(s.Devices, byName)
	slices.SortFunc(s.Headerless, byName)
	slices.SortFunc(s.Addrs, netip.Addr.Compare)
	s.Addrs = slices.Compact(s.Addrs)
	return s
}

// native tells a device of the node's own from one of pods, overlays or
// bridges; addrs are its node addresses.
func native(l Link, addrs, nodeIPs []netip.Addr) bool {
	switch {
	case !l.Up, l.Loopback, l.HasMaster:
		return false
	case slices.ContainsFunc(addrs, func(a netip.Addr) bool { return slices.Contains(nodeIPs, a) }):
		return true
	case slices.Contains(excludedKinds, l.Kind):
		return false
	case slices.ContainsFunc(excludedPrefixes, func(p string) bool { return strings.HasPrefix(l.Name, p) }):
		return false
	case l.Kind == "veth" && !l.DefaultRoute:
		return false
	}
	return true
}

// nodeAddrs are the addresses of addrs that can serve NodePorts.
func nodeAddrs(addrs []Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		ip := a.IP.Unmap()
		if a.Tentative || !ip.IsValid() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() {
			continue
		}
		out = append(out, ip)
	}
	return out
}
