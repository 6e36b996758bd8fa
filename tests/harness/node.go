package harness

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Options configures a Node. The zero value gives the defaults below.
type Options struct {
	// BridgeName is the pod bridge inside the node namespace. Default "kprbr0".
	BridgeName string
	// UplinkName is the interface standing in for the node's NIC; it
	// carries addresses added with Node.AddAddress. It is a veth whose peer
	// (<UplinkName>-wire, or "uplink-wire" for long names) stays down, so
	// nothing sent out of it leaves the namespace. Default "eth0".
	UplinkName string
	// GatewayV4 is the bridge's IPv4 address and the pod IPv4 subnet; pods
	// get the addresses after it. Default 10.244.0.1/24.
	GatewayV4 netip.Prefix
	// GatewayV6 is the bridge's IPv6 address and the pod IPv6 subnet; pods
	// get the addresses after it. Default fd00:244::1/64.
	GatewayV6 netip.Prefix
}

func (o Options) withDefaults() (Options, error) {
	if o.BridgeName == "" {
		o.BridgeName = "kprbr0"
	}
	if o.UplinkName == "" {
		o.UplinkName = "eth0"
	}
	if !o.GatewayV4.IsValid() {
		o.GatewayV4 = netip.MustParsePrefix("10.244.0.1/24")
	}
	if !o.GatewayV6.IsValid() {
		o.GatewayV6 = netip.MustParsePrefix("fd00:244::1/64")
	}
	for _, gw := range []netip.Prefix{o.GatewayV4, o.GatewayV6} {
		if gw.Addr() == gw.Masked().Addr() {
			return o, fmt.Errorf("gateway %s is the subnet's network address; give a host address such as %s", gw, gw.Masked().Addr().Next())
		}
	}
	if !o.GatewayV4.Addr().Is4() {
		return o, fmt.Errorf("Options.GatewayV4 %s is not an IPv4 prefix", o.GatewayV4)
	}
	if !o.GatewayV6.Addr().Is6() || o.GatewayV6.Addr().Is4In6() {
		return o, fmt.Errorf("Options.GatewayV6 %s is not an IPv6 prefix", o.GatewayV6)
	}
	if o.BridgeName == o.UplinkName {
		return o, fmt.Errorf("Options.BridgeName and UplinkName are both %q", o.BridgeName)
	}
	for _, n := range []string{o.BridgeName, o.UplinkName} {
		if len(n) == 0 || len(n) >= unix.IFNAMSIZ {
			return o, fmt.Errorf("interface name %q must be 1 to %d characters", n, unix.IFNAMSIZ-1)
		}
	}
	return o, nil
}

// Node is a network namespace playing a Kubernetes node: a bridge holding the
// pod gateways, IP forwarding on, and no link to the host. Create it with
// NewNode; it is torn down by the test's cleanup.
type Node struct {
	// NetNS is the node namespace. Sockets created in it are "host
	// network" sockets of the simulated node.
	NetNS *NetNS
	// Bridge is the name of the pod bridge, BridgeIndex its ifindex inside
	// NetNS.
	Bridge      string
	BridgeIndex int
	// Uplink is the name of the stand-in NIC carrying AddAddress addresses,
	// UplinkIndex its ifindex inside NetNS.
	Uplink      string
	UplinkIndex int
	// GatewayV4 and GatewayV6 are the bridge addresses; pods use them as
	// default gateways.
	GatewayV4 netip.Prefix
	GatewayV6 netip.Prefix

	suffix string // random part shared by every namespace of this node

	mu       sync.Mutex
	pods     []*Pod // in creation order
	reserved map[string]bool
	lastV4   netip.Addr
	lastV6   netip.Addr
	// The last addresses given to routed pods (AddRoutedPod).
	lastRoutedV4, lastRoutedV6 netip.Addr
	vethSeq                    int
	closed                     bool
}

// NewNode builds the node namespace and registers its teardown (pods,
// servers, namespaces) with tb.Cleanup. It needs root; call RequireRoot
// first to skip cleanly otherwise. The calling thread's namespace is not
// changed.
func NewNode(tb testing.TB, opts Options) (*Node, error) {
	tb.Helper()
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	sweepStaleOnce()
	n := &Node{
		Bridge:       opts.BridgeName,
		Uplink:       opts.UplinkName,
		GatewayV4:    opts.GatewayV4,
		GatewayV6:    opts.GatewayV6,
		suffix:       randomSuffix(6),
		reserved:     map[string]bool{},
		lastV4:       opts.GatewayV4.Addr(),
		lastV6:       opts.GatewayV6.Addr(),
		lastRoutedV4: routedV4.Addr(),
		lastRoutedV6: routedV6.Addr(),
	}
	n.NetNS, err = newNetNS(NamePrefix + n.suffix + "-node")
	if err != nil {
		return nil, err
	}
	if err := n.setup(); err != nil {
		return nil, errors.Join(fmt.Errorf("set up node netns %s: %w", n.NetNS.Name, err), n.close())
	}
	tb.Cleanup(func() {
		if err := n.close(); err != nil {
			tb.Errorf("harness: tearing down node %s: %v", n.NetNS.Name, err)
		}
	})
	return n, nil
}

func (n *Node) setup() error {
	// Sysctls first: interfaces created afterwards copy the "default" values.
	for _, s := range [][2]string{
		{"net/ipv4/ip_forward", "1"},
		{"net/ipv6/conf/all/forwarding", "1"},
		// Pod addresses must work immediately; DAD would hold them back ~1s.
		{"net/ipv6/conf/default/accept_dad", "0"},
		// The namespace inherits rp_filter from the host; pin it off so
		// results do not depend on the machine the tests run on.
		{"net/ipv4/conf/all/rp_filter", "0"},
		{"net/ipv4/conf/default/rp_filter", "0"},
	} {
		if err := n.NetNS.writeSysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	nl := n.NetNS.Netlink()

	// No multicast snooping: the bridge floods all multicast, so IPv6
	// neighbour discovery between pods never depends on which MLD reports
	// the bridge happens to have seen.
	noSnooping := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge}, MulticastSnooping: &noSnooping}
	if err := nl.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge %s: %w", n.Bridge, err)
	}
	for _, p := range []netip.Prefix{n.GatewayV4, n.GatewayV6} {
		if err := addAddr(nl, br, p); err != nil {
			return err
		}
	}
	if err := nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("set bridge %s up: %w", n.Bridge, err)
	}
	n.BridgeIndex = br.Attrs().Index

	// The uplink is one end of a veth pair whose other end stays down and
	// unaddressed: a NIC with the cable pulled. Its addresses are local to
	// the node, and nothing routed out of it can leave the namespace.
	// (A dummy interface would do, but not every kernel has the module.)
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.Uplink}, PeerName: uplinkPeerName(n.Uplink)}
	if err := nl.LinkAdd(up); err != nil {
		return fmt.Errorf("create uplink veth %s: %w", n.Uplink, err)
	}
	if err := nl.LinkSetUp(up); err != nil {
		return fmt.Errorf("set uplink %s up: %w", n.Uplink, err)
	}
	n.UplinkIndex = up.Attrs().Index
	return nil
}

// AddAddress adds an address (for example a node IP such as
// 192.168.100.10/24 for NodePort tests) to the node's uplink. Traffic
// to it from pods is routed through the bridge gateway and delivered
// locally; it never leaves the node namespace.
func (n *Node) AddAddress(prefix netip.Prefix) error {
	up, err := n.NetNS.Netlink().LinkByIndex(n.UplinkIndex)
	if err != nil {
		return fmt.Errorf("find uplink %s in %s: %w", n.Uplink, n.NetNS.Name, err)
	}
	return addAddr(n.NetNS.Netlink(), up, prefix)
}

// AddPod creates a pod namespace wired to the node bridge, with the next
// free IPv4 and IPv6 addresses, default routes via the gateways and lo up.
// It returns once the pod is reachable: links operational and addresses
// usable, so the first packet to or from it is not lost.
// name must be 1-32 characters of [a-z0-9-] and unique on the node.
func (n *Node) AddPod(name string) (*Pod, error) {
	return n.addPod(name, false)
}

// routedV4 and routedV6 hold the addresses of routed pods (after the
// first), the same on every node: no test links two nodes' routed pods.
var (
	routedV4 = netip.MustParsePrefix("10.245.0.1/24")
	routedV6 = netip.MustParsePrefix("fd00:245::1/64")
)

// AddRoutedPod is AddPod for a routed CNI (Calico's way): the pod's veth
// is on no bridge, and its addresses (from 10.245.0.0/24 and
// fd00:245::/64, outside the bridge's subnet) are host addresses; the
// node routes each to the veth, and the pod sends everything there: IPv4
// through Calico's gateway 169.254.1.1, IPv6 to the veth's link-local
// address.
func (n *Node) AddRoutedPod(name string) (*Pod, error) {
	return n.addPod(name, true)
}

func (n *Node) addPod(name string, routed bool) (*Pod, error) {
	if !validName(name) {
		return nil, fmt.Errorf("pod name %q: use 1-32 characters of [a-z0-9-]", name)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errors.New("AddPod: node already torn down")
	}
	if n.reserved[name] {
		n.mu.Unlock()
		return nil, fmt.Errorf("AddPod: pod %q already exists on node %s", name, n.NetNS.Name)
	}
	// A routed pod's addresses are outside the bridge's subnet: the
	// bridged pods would look for them on the bridge.
	subnet4, subnet6, last4, last6 := n.GatewayV4, n.GatewayV6, &n.lastV4, &n.lastV6
	if routed {
		subnet4, subnet6, last4, last6 = routedV4, routedV6, &n.lastRoutedV4, &n.lastRoutedV6
	}
	v4, err4 := nextAddr(subnet4, *last4)
	v6, err6 := nextAddr(subnet6, *last6)
	if err := errors.Join(err4, err6); err != nil {
		n.mu.Unlock()
		return nil, err
	}
	// Addresses are never reused: a recycled IP could match stale neighbor
	// or conntrack entries and make a test pass or fail by accident.
	*last4, *last6 = v4, v6
	n.vethSeq++
	hostVeth := fmt.Sprintf("kprv%d", n.vethSeq)
	n.reserved[name] = true
	n.mu.Unlock()

	p, err := n.buildPod(name, hostVeth, v4, v6, routed)
	if err != nil {
		n.mu.Lock()
		delete(n.reserved, name)
		n.mu.Unlock()
		return nil, fmt.Errorf("add pod %s: %w", name, err)
	}
	n.mu.Lock()
	n.pods = append(n.pods, p)
	n.mu.Unlock()
	return p, nil
}

func (n *Node) buildPod(name, hostVeth string, v4, v6 netip.Addr, routed bool) (*Pod, error) {
	p := &Pod{Name: name, IPv4: v4, IPv6: v6, HostVeth: hostVeth, node: n, routed: routed}
	var err error
	if p.NetNS, err = newNetNS(NamePrefix + n.suffix + "-" + name); err != nil {
		return nil, err
	}
	if err := p.wire(); err != nil {
		return nil, errors.Join(err, p.teardown())
	}
	return p, nil
}

// wire creates the veth pair straight into both namespaces (the pod end is
// born inside the pod netns, so no interface ever appears on the host) and
// configures the pod side.
func (p *Pod) wire() error {
	n := p.node
	// Interfaces created in the pod netns copy its defaults; turn DAD off
	// there first so eth0's link-local address is usable at once as well.
	if err := p.NetNS.writeSysctl("net/ipv6/conf/default/accept_dad", "0"); err != nil {
		return err
	}
	master := n.BridgeIndex
	if p.routed {
		master = 0
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.HostVeth, MasterIndex: master},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(p.NetNS.Handle())),
	}
	nodeNL := n.NetNS.Netlink()
	if err := nodeNL.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s<->eth0 between %s and %s: %w", p.HostVeth, n.NetNS.Name, p.NetNS.Name, err)
	}
	if err := nodeNL.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set host veth %s up: %w", p.HostVeth, err)
	}
	p.HostVethIndex = veth.Attrs().Index

	podNL := p.NetNS.Netlink()
	eth0, err := podNL.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0 in %s: %w", p.NetNS.Name, err)
	}
	p.EthIndex = eth0.Attrs().Index
	bits4, bits6 := n.GatewayV4.Bits(), n.GatewayV6.Bits()
	if p.routed {
		bits4, bits6 = 32, 128
	}
	for _, a := range []netip.Prefix{netip.PrefixFrom(p.IPv4, bits4), netip.PrefixFrom(p.IPv6, bits6)} {
		if err := addAddr(podNL, eth0, a); err != nil {
			return err
		}
	}
	if err := podNL.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("set eth0 up in %s: %w", p.NetNS.Name, err)
	}
	// A fresh link is not usable the moment it is set up, and the first
	// packets lost to it cost a 1s retransmit (SYN or neighbour
	// solicitation). Until the kernel's linkwatch work runs, a link
	// transmits through the noop qdisc and drops everything; linkwatch sets
	// the operstate in the same step, so wait for UP. After that, a link's
	// IPv6 layer drops incoming multicast (neighbour solicitations) until
	// addrconf has handled the carrier; it creates the link-local address
	// in that step, so wait for one as well.
	if p.routed {
		return p.route(podNL, nodeNL, eth0)
	}
	if err := p.waitUp(podNL, nodeNL, true); err != nil {
		return err
	}
	if err := waitFor("IPv6 link-local address on eth0 in "+p.NetNS.Name, hasLinkLocal(podNL, p.EthIndex)); err != nil {
		return err
	}
	// The bridge gets its carrier with its first port; the gateway answers
	// neighbour solicitations only once addrconf has handled that too.
	if err := waitFor("IPv6 link-local address on "+n.Bridge+" in "+n.NetNS.Name, hasLinkLocal(nodeNL, n.BridgeIndex)); err != nil {
		return err
	}
	for _, gw := range []netip.Addr{n.GatewayV4.Addr(), n.GatewayV6.Addr()} {
		anyAddr := netip.IPv4Unspecified()
		if gw.Is6() {
			anyAddr = netip.IPv6Unspecified()
		}
		r := &netlink.Route{
			LinkIndex: eth0.Attrs().Index,
			Dst:       prefixToIPNet(netip.PrefixFrom(anyAddr, 0)),
			Gw:        gw.AsSlice(),
		}
		if err := podNL.RouteAdd(r); err != nil {
			return fmt.Errorf("add default route via %s in %s: %w", gw, p.NetNS.Name, err)
		}
	}
	return nil
}

// waitUp waits until both ends of the pod's veth, and the bridge if it is
// on one, are operationally up.
func (p *Pod) waitUp(podNL, nodeNL *netlink.Handle, bridged bool) error {
	n := p.node
	links := []struct {
		nl    *netlink.Handle
		index int
		where string
	}{
		{podNL, p.EthIndex, "eth0 in " + p.NetNS.Name},
		{nodeNL, p.HostVethIndex, p.HostVeth + " in " + n.NetNS.Name},
	}
	if bridged {
		links = append(links, struct {
			nl    *netlink.Handle
			index int
			where string
		}{nodeNL, n.BridgeIndex, n.Bridge + " in " + n.NetNS.Name})
	}
	for _, l := range links {
		if err := waitFor(l.where+" operationally up", operUp(l.nl, l.index)); err != nil {
			return err
		}
	}
	return nil
}

// route wires a routed pod (AddRoutedPod): host routes to the pod on the
// node, and the pod's default routes to the node's end of its veth.
func (p *Pod) route(podNL, nodeNL *netlink.Handle, eth0 netlink.Link) error {
	n := p.node
	if err := p.waitUp(podNL, nodeNL, false); err != nil {
		return err
	}
	if err := waitFor("IPv6 link-local address on "+p.HostVeth+" in "+n.NetNS.Name, hasLinkLocal(nodeNL, p.HostVethIndex)); err != nil {
		return err
	}
	if err := waitFor("IPv6 link-local address on eth0 in "+p.NetNS.Name, hasLinkLocal(podNL, p.EthIndex)); err != nil {
		return err
	}
	for _, a := range []netip.Addr{p.IPv4, p.IPv6} {
		r := &netlink.Route{LinkIndex: p.HostVethIndex, Dst: prefixToIPNet(netip.PrefixFrom(a, a.BitLen()))}
		if err := nodeNL.RouteAdd(r); err != nil {
			return fmt.Errorf("route %s to %s in %s: %w", a, p.HostVeth, n.NetNS.Name, err)
		}
	}
	hostLL, err := linkLocal(nodeNL, p.HostVethIndex)
	if err != nil {
		return err
	}
	host, err := nodeNL.LinkByIndex(p.HostVethIndex)
	if err != nil {
		return err
	}
	// Calico's gateway, an address no one holds: its node answers the
	// pod's ARP for it (proxy ARP, given a default route, which this
	// node lacks); here the pod knows its MAC, the veth's, beforehand.
	gw4 := netip.MustParseAddr("169.254.1.1")
	if err := podNL.NeighAdd(&netlink.Neigh{LinkIndex: p.EthIndex, IP: gw4.AsSlice(), HardwareAddr: host.Attrs().HardwareAddr,
		State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}); err != nil {
		return fmt.Errorf("neighbour %s in %s: %w", gw4, p.NetNS.Name, err)
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: p.EthIndex, Dst: prefixToIPNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0)), Gw: gw4.AsSlice(), Flags: int(netlink.FLAG_ONLINK)},
		{LinkIndex: p.EthIndex, Dst: prefixToIPNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0)), Gw: hostLL.AsSlice()},
	} {
		if err := podNL.RouteAdd(r); err != nil {
			return fmt.Errorf("add default route %s in %s: %w", r.Dst, p.NetNS.Name, err)
		}
	}
	return nil
}

// RemovePod stops the pod's servers and deletes its veth pair and
// namespace. The pod's addresses are not handed out again.
func (n *Node) RemovePod(name string) error {
	n.mu.Lock()
	i := slices.IndexFunc(n.pods, func(p *Pod) bool { return p.Name == name })
	if i < 0 {
		n.mu.Unlock()
		return fmt.Errorf("RemovePod: no pod %q on node %s", name, n.NetNS.Name)
	}
	p := n.pods[i]
	n.pods = slices.Delete(n.pods, i, i+1)
	delete(n.reserved, name)
	n.mu.Unlock()
	return p.teardown()
}

// Pod returns the pod called name, or nil.
func (n *Node) Pod(name string) *Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := slices.IndexFunc(n.pods, func(p *Pod) bool { return p.Name == name })
	if i < 0 {
		return nil
	}
	return n.pods[i]
}

// Pods returns the node's pods in creation order.
func (n *Node) Pods() []*Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.pods)
}

// close removes every pod (newest first) and then the node namespace. It is
// idempotent.
func (n *Node) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	pods := n.pods
	n.pods = nil
	n.mu.Unlock()

	var errs []error
	for i := len(pods) - 1; i >= 0; i-- {
		errs = append(errs, pods[i].teardown())
	}
	if n.NetNS != nil {
		errs = append(errs, n.NetNS.destroy())
	}
	return errors.Join(errs...)
}

// nextAddr returns the address after last inside subnet, refusing the
// subnet's last address (the IPv4 broadcast address).
func nextAddr(subnet netip.Prefix, last netip.Addr) (netip.Addr, error) {
	next := last.Next()
	if !next.IsValid() || !subnet.Contains(next) || !subnet.Contains(next.Next()) {
		return netip.Addr{}, fmt.Errorf("pod subnet %s is out of addresses", subnet.Masked())
	}
	return next, nil
}
