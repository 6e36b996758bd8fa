package netfilter

import (
	"net/netip"
)

// LocalTraffic tells packets from this node's pods from the rest, as
// kube-proxy's --detect-local-mode does: by source address (the cluster's
// pod range, ClusterCIDR, or the node's, NodeCIDR), by the bridge the pods
// hang off (BridgeInterface), or by the prefix of their interfaces' names
// (InterfaceNamePrefix). The zero value tells nothing apart, and no rule
// that depends on it is written.
type LocalTraffic struct {
	// CIDRs are the pod ranges, at most one per family (kube-proxy's
	// limit); a family without one has no detection by address.
	CIDRs []netip.Prefix
	// Bridge is the name of the pods' bridge.
	Bridge string
	// InterfacePrefix is the start of every pod interface's name.
	InterfacePrefix string
}

// CIDR is the pod range of fam, if one was given.
func (l LocalTraffic) CIDR(fam Family) (netip.Prefix, bool) {
	for _, c := range l.CIDRs {
		if FamilyOf(c.Addr()) == fam {
			return c, true
		}
	}
	return netip.Prefix{}, false
}

// Detects reports whether fam's traffic is told apart at all.
func (l LocalTraffic) Detects(fam Family) bool {
	return len(l.IPTablesLocal(fam)) > 0
}

// IPTablesLocal are the iptables match words of traffic from a local pod;
// nil when fam's traffic is not told apart.
func (l LocalTraffic) IPTablesLocal(fam Family) []string {
	return l.iptables(fam, nil)
}

// IPTablesNotLocal are the iptables match words of traffic from anything
// but a local pod; nil when fam's traffic is not told apart.
func (l LocalTraffic) IPTablesNotLocal(fam Family) []string {
	return l.iptables(fam, []string{"!"})
}

func (l LocalTraffic) iptables(fam Family, not []string) []string {
	switch {
	case l.Bridge != "":
		return append(not, "-i", l.Bridge)
	case l.InterfacePrefix != "":
		// iptables' wildcard: a name ending in + matches every name with
		// that prefix.
		return append(not, "-i", l.InterfacePrefix+"+")
	}
	if cidr, ok := l.CIDR(fam); ok {
		return append(not, "-s", cidr.String())
	}
	return nil
}

// NFTLocal is the nftables expression of traffic from a local pod; ""
// when fam's traffic is not told apart.
func (l LocalTraffic) NFTLocal(fam Family) string {
	return l.nft(fam, "")
}

// NFTNotLocal is the nftables expression of traffic from anything but a
// local pod; "" when fam's traffic is not told apart.
func (l LocalTraffic) NFTNotLocal(fam Family) string {
	return l.nft(fam, "!= ")
}

func (l LocalTraffic) nft(fam Family, op string) string {
	switch {
	case l.Bridge != "":
		// iifname, not iif: the bridge may come and go, and iif would be
		// bound to the index it had when the rule was written.
		return "iifname " + op + quoteNFT(l.Bridge)
	case l.InterfacePrefix != "":
		return "iifname " + op + quoteNFT(l.InterfacePrefix+"*")
	}
	if cidr, ok := l.CIDR(fam); ok {
		word := "ip"
		if fam == IPv6 {
			word = "ip6"
		}
		return word + " saddr " + op + cidr.String()
	}
	return ""
}

// quoteNFT quotes an interface name for nft, which reads a bare name with
// a wildcard or a dash as something else.
func quoteNFT(name string) string { return `"` + name + `"` }
