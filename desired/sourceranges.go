package desired

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
)

// sourceRanges parses spec.loadBalancerSourceRanges as kube-proxy's
// service change tracker does, for the families that have a load-balancer
// ingress IP (the only frontends the ranges restrict):
//
//   - entries are trimmed of surrounding spaces (API validation lets them
//     through) and masked to their network; an entry that is not a CIDR is
//     a Problem and is ignored, as kube-proxy ignores it with an error log;
//   - a zero-length prefix (0.0.0.0/0, ::/0) means "every client", the same
//     as no ranges, for its family;
//   - when a range of a family holds the node's primary IP of that family,
//     the load-balancer IPs of that family are let through as sources too:
//     a VIP that is also a local address (an ip rule of the load balancer
//     agent) makes the node's own requests to it loop back with the VIP as
//     their source (kube-proxy's allowFromNode).
func (t *translation) sourceRanges() []netip.Prefix {
	if len(t.svc.Spec.LoadBalancerSourceRanges) == 0 {
		return nil
	}
	vips := map[family][]netip.Addr{}
	for f, addrs := range t.externalAddrs {
		for _, e := range addrs {
			if e.kind == dataplane.LoadBalancer {
				vips[f] = append(vips[f], e.addr)
			}
		}
	}
	byFamily := map[family][]netip.Prefix{}
	anyClient := map[family]bool{}
	for _, s := range t.svc.Spec.LoadBalancerSourceRanges {
		p, ok := parseCIDR(s)
		if !ok {
			t.problem(t.svcObject, fmt.Sprintf("loadBalancerSourceRanges entry %s is not a valid CIDR; ignored, as kube-proxy does", quote(s)))
			continue
		}
		f := familyOf(p.Addr())
		if p.Bits() == 0 {
			anyClient[f] = true
		}
		byFamily[f] = append(byFamily[f], p)
	}
	var out []netip.Prefix
	for _, f := range []family{ipv4, ipv6} {
		if len(vips[f]) == 0 || anyClient[f] || len(byFamily[f]) == 0 {
			continue
		}
		out = append(out, byFamily[f]...)
		if t.rangesHoldNode(f, byFamily[f]) {
			for _, vip := range vips[f] {
				out = append(out, netip.PrefixFrom(vip, vip.BitLen()))
			}
		}
	}
	slices.SortFunc(out, comparePrefixes)
	return slices.Compact(out)
}

// rangesHoldNode reports whether one of ranges holds the node's primary IP
// of family f.
func (t *translation) rangesHoldNode(f family, ranges []netip.Prefix) bool {
	for _, ip := range t.node.PrimaryIPs {
		ip = ip.Unmap()
		if familyOf(ip) != f {
			continue
		}
		for _, p := range ranges {
			if p.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// parseCIDR parses one source range: trimmed, masked, an IPv4-mapped IPv6
// prefix as the IPv4 prefix it stands for. Zoned prefixes are refused.
func parseCIDR(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil || p.Addr().Zone() != "" {
		return netip.Prefix{}, false
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, false
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), true
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
