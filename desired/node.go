package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Keywords --nodeport-addresses accepts besides CIDRs, as kube-proxy does.
const (
	NodePortAddressesPrimary   = "primary"
	NodePortAddressesLocalhost = "localhost"
	NodePortAddressesAll       = "all"
)

// Loopback addresses NodePorts may be served on, for sockets of the node's
// own network namespace only (the BPF programs check the namespace).
var (
	loopback4 = netip.MustParseAddr("127.0.0.1")
	loopback6 = netip.MustParseAddr("::1")
)

// NodePortAddresses is a parsed --nodeport-addresses value: which of the
// node's addresses serve NodePorts. The zero value serves all of them,
// loopback included.
type NodePortAddresses struct {
	prefixes []netip.Prefix
	primary  bool
	// noLoopback leaves 127.0.0.1 and ::1 out whatever the list says
	// (kube-proxy's localhostNodePorts: false).
	noLoopback bool
}

// WithoutLoopback is npa serving no NodePort on 127.0.0.1 or ::1, which is
// what kube-proxy's --iptables-localhost-nodeports=false (the file's
// iptables.localhostNodePorts: false) asks of every mode.
func (npa NodePortAddresses) WithoutLoopback() NodePortAddresses {
	npa.noLoopback = true
	return npa
}

// ParseNodePortAddresses parses --nodeport-addresses: CIDRs and the keywords
// kube-proxy knows, "primary" (the Node object's primary IP of each family),
// "localhost" (127.0.0.0/8 and ::1/128) and "all" (0.0.0.0/0 and ::/0).
// An empty list means all.
//
// An address serves NodePorts when the list covers it. That is stricter
// than kube-proxy in one case: kube-proxy treats a family for which the list
// has no CIDR as "all" (and warns), kpr serves no address of that family.
func ParseNodePortAddresses(values []string) (NodePortAddresses, error) {
	var npa NodePortAddresses
	seen := map[string]bool{}
	for _, raw := range values {
		v := strings.TrimSpace(raw)
		switch v {
		case NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll:
			if seen[v] {
				return NodePortAddresses{}, fmt.Errorf("keyword %q is listed twice", v)
			}
			seen[v] = true
		}
		switch v {
		case NodePortAddressesPrimary:
			npa.primary = true
		case NodePortAddressesLocalhost:
			npa.prefixes = append(npa.prefixes, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"))
		case NodePortAddressesAll:
			npa.prefixes = append(npa.prefixes, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
		default:
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return NodePortAddresses{}, fmt.Errorf("%q is neither a CIDR such as 192.168.0.0/16 nor one of the keywords %s, %s, %s",
					raw, NodePortAddressesPrimary, NodePortAddressesLocalhost, NodePortAddressesAll)
			}
			npa.prefixes = append(npa.prefixes, p.Masked())
		}
	}
	return npa, nil
}

func (npa NodePortAddresses) matchAll() bool { return !npa.primary && len(npa.prefixes) == 0 }

// Covers reports whether NodePorts are served on a, if a is one of the
// node's addresses.
func (npa NodePortAddresses) Covers(a netip.Addr) bool { return npa.covers(a) }

func (npa NodePortAddresses) covers(a netip.Addr) bool {
	return npa.matchAll() || slices.ContainsFunc(npa.prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
}

// Select returns the addresses NodePorts are served on: the node's
// InternalIP and ExternalIP addresses, the local addresses (those on the
// node's own devices, as kube-proxy serves NodePorts on the node's
// interface addresses) and the loopback addresses 127.0.0.1 and ::1 that
// the list covers, plus the primary IPs for "primary", which are the Node
// object's alone. node may be nil (not seen yet). The result is sorted and
// free of duplicates.
func (npa NodePortAddresses) Select(node *v1.Node, local ...netip.Addr) []netip.Addr {
	var out []netip.Addr
	candidates := append(NodeIPs(node), local...)
	if !npa.noLoopback {
		candidates = append(candidates, loopback4, loopback6)
	}
	for _, a := range candidates {
		if npa.covers(a) && !(npa.noLoopback && a.IsLoopback()) {
			out = append(out, a)
		}
	}
	if npa.primary {
		out = append(out, PrimaryIPs(node)...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// NodeIPs returns the node's InternalIP and ExternalIP addresses from its
// status, sorted and without duplicates; nil for a nil node.
func NodeIPs(node *v1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
			continue
		}
		if addr, ok := parseIP(a.Address); ok {
			out = append(out, addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// PrimaryIPs returns the node's primary IP of each family, as kube-proxy
// picks them for "primary": the first InternalIP (the first ExternalIP if
// there is none), then the first address of the other family in the same
// order.
func PrimaryIPs(node *v1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var ordered []netip.Addr
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if addr, ok := parseIP(a.Address); ok {
				ordered = append(ordered, addr)
			}
		}
	}
	if len(ordered) == 0 {
		return nil
	}
	out := []netip.Addr{ordered[0]}
	for _, a := range ordered[1:] {
		if familyOf(a) != familyOf(out[0]) {
			return append(out, a)
		}
	}
	return out
}

// ExternalIPPolicy says which Service externalIPs the node's own sockets are
// sent to backends for (kpr run --external-ips).
//
// An ExternalIP frontend captures connections from every socket on the
// node, to any address a Service author writes into spec.externalIPs: a
// tenant who may create Services can intercept traffic to addresses that
// are not the cluster's (CVE-2020-8554). kube-proxy does the same, and
// leaves the defence to admission control (DenyServiceExternalIPs).
type ExternalIPPolicy uint8

const (
	// ExternalIPsAll translates every ExternalIP, as kube-proxy does.
	ExternalIPsAll ExternalIPPolicy = iota
	// ExternalIPsNodeLocal translates only ExternalIPs that are addresses
	// of this node, as Cilium's socket LB does.
	ExternalIPsNodeLocal
	// ExternalIPsNone translates no ExternalIP.
	ExternalIPsNone
)

var externalIPPolicyNames = []string{"all", "node-local", "none"}

func (p ExternalIPPolicy) String() string {
	if int(p) < len(externalIPPolicyNames) {
		return externalIPPolicyNames[p]
	}
	return fmt.Sprintf("ExternalIPPolicy(%d)", uint8(p))
}

// ParseExternalIPPolicy parses "all", "node-local" or "none".
func ParseExternalIPPolicy(s string) (ExternalIPPolicy, error) {
	if i := slices.Index(externalIPPolicyNames, s); i >= 0 {
		return ExternalIPPolicy(i), nil
	}
	return 0, fmt.Errorf("%q: want one of %s", s, strings.Join(externalIPPolicyNames, ", "))
}

// NodeConfig is the part of kpr's configuration that shapes the node facts.
type NodeConfig struct {
	NodePortAddresses NodePortAddresses
	ExternalIPs       ExternalIPPolicy
}

// NewNode returns the node facts for translation from this node's Node
// object, or from nil before it has been seen, and the addresses on the
// node's own devices (local), which serve NodePorts alongside the Node
// object's.
//
// Which ExternalIPs are "local" under ExternalIPsNodeLocal is decided by
// the Node object's status addresses, not by the addresses on the host's
// interfaces. Tenants cannot write a Node's status (the kubelet does, and
// NodeRestriction limits it to its own Node), kpr already watches the
// object and recomputes every Service when its addresses change, and the
// translation stays a pure function of API objects. An address configured
// on an interface but not reported in the Node's status is not local by
// this rule; run with --external-ips=all to serve such addresses.
func NewNode(name string, node *v1.Node, cfg NodeConfig, local ...netip.Addr) Node {
	n := Node{
		Name:        name,
		Addresses:   cfg.NodePortAddresses.Select(node, local...),
		IPs:         NodeIPs(node),
		PrimaryIPs:  PrimaryIPs(node),
		ExternalIPs: cfg.ExternalIPs,
	}
	if node != nil {
		n.Zone = node.Labels[v1.LabelTopologyZone]
	}
	return n
}

// Equal reports whether two sets of node facts translate alike.
func (n Node) Equal(o Node) bool {
	return n.Name == o.Name && n.Zone == o.Zone && n.ExternalIPs == o.ExternalIPs &&
		slices.Equal(n.Addresses, o.Addresses) && slices.Equal(n.IPs, o.IPs) && slices.Equal(n.PrimaryIPs, o.PrimaryIPs)
}
