package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// config is what the rendering depends on beside the ServicePorts.
type config struct {
	masq netfilter.Masquerade
}

// chain is one chain a ServicePort owns, with its rules as nft reads them.
type chain struct {
	name  string
	rules []string
}

// affinity is one ClientIP affinity set a ServicePort owns: the clients
// that stick to one endpoint for timeout seconds.
type affinity struct {
	name    string
	timeout uint32
}

// element is one element a ServicePort puts in a shared verdict map, or
// in the hairpin set (value "").
type element struct {
	m     string
	key   []string
	value string
}

// id is the element's map and key, what an element is found by.
func (e element) id() string { return e.m + " " + strings.Join(e.key, " . ") }

// portRules is what one ServicePort writes in one family's table: the
// chains and sets it owns, its elements of the shared maps, and its
// elements of the hairpin set, which other ServicePorts may share.
type portRules struct {
	chains   []chain
	sets     []affinity
	elements []element
	hairpin  []element
}

// renderPort renders the frontends of sp that belong to fam. It is pure:
// the same ServicePort always renders to the same rules.
//
// The layout is kube-proxy's nftables mode, in one inet table so that a
// sync of both families is one transaction; the maps are per family
// (mapOf), since their keys hold addresses:
//   - service-ips sends a ClusterIP to its service chain (every endpoint,
//     or those internalTrafficPolicy keeps), and a NodePort, external or
//     load-balancer frontend to its external chain, which masquerades and
//     picks the service chain for traffic of the node itself, and for
//     outside traffic too under externalTrafficPolicy Cluster; under
//     Local, outside traffic keeps its source and goes to the local chain
//     (node-local endpoints);
//   - a service chain marks ClusterIP traffic from outside the cluster
//     CIDR for masquerading, sends a client with affinity to its
//     endpoint, and picks one with numgen: DNATing to it itself
//     (dnatToOne, hairpin through the hairpin-connections sets) or going
//     to its endpoint chain (pickEndpoint), which DNATs (see render);
//   - a frontend without endpoints is in no-endpoint-services (reject);
//     one whose outside traffic has no endpoint under a Local policy is
//     in no-local-endpoints (drop, outside traffic only);
//   - a load-balancer IP with loadBalancerSourceRanges of its family is
//     in firewall-ips, whose chain drops other sources before DNAT.
//
// kpr's frontends carry their addresses, NodePorts too, so every element
// names its destination address (kube-proxy matches NodePorts by port on
// every local address). NodePorts on loopback are not served, as in
// kube-proxy's nftables mode: a packet DNATed from 127.0.0.1 to a pod
// needs route_localnet, which this mode does not set.
func renderPort(sp *dataplane.ServicePort, fam netfilter.Family, cfg config) *portRules {
	out := &portRules{}
	var fes []dataplane.Frontend
	for _, fe := range sp.Frontends {
		if netfilter.FamilyOf(fe.Addr) == fam && servable(fe) {
			fes = append(fes, fe)
		}
	}
	if len(fes) == 0 {
		return out
	}
	pol := newPolicies(sp.Name, fes, fam)
	word := addrWord(fam)
	proto := netfilter.ProtoName(sp.Name.Protocol)

	for _, fe := range fes {
		internal := pol.set(fe.Backends)
		external := internal
		if fe.ExternalBackends != nil {
			external = pol.set(fe.ExternalBackends)
		}
		local := fe.ExternalBackends != nil
		direct := fe.Kind == dataplane.ClusterIP && !local
		key := []string{fe.Addr.Unmap().String(), proto, strconv.Itoa(int(fe.Port))}
		dest := word + " daddr " + key[0] + " " + proto + " dport " + key[2]

		if fe.Kind == dataplane.ClusterIP && !internal.empty() {
			internal.markMasq(clusterIPMasquerade(cfg.masq, fam, dest))
		}
		if !internal.empty() || !external.empty() {
			target := internal.chain
			if !direct {
				target = pol.external(internal, external, local).name
			}
			if ranges := sp.SourceRangesFor(fe); len(ranges) > 0 {
				fw := pol.firewall(ranges)
				out.elements = append(out.elements, element{m: mapOf(mapFirewallIPs, fam), key: key, value: "jump " + fw.name})
			}
			out.elements = append(out.elements, element{m: mapOf(mapServiceIPs, fam), key: key, value: "goto " + target})
		}
		switch {
		case internal.empty():
			out.elements = append(out.elements, element{m: mapOf(mapNoEndpoints, fam), key: key, value: "goto " + chainReject})
		case external.empty() && !direct:
			out.elements = append(out.elements, element{m: mapOf(mapNoLocalEndpoints, fam), key: key, value: "drop"})
		}
	}

	for _, f := range pol.fws {
		out.chains = append(out.chains, f.render(word))
	}
	for _, e := range pol.exts {
		out.chains = append(out.chains, e.render(cfg.masq.Local.NFTLocal(fam)))
	}
	pol.render(sp, word, proto, out)
	return out
}

// servable reports whether the nftables dataplane serves fe: every
// frontend but NodePorts on loopback (see renderPort).
func servable(fe dataplane.Frontend) bool {
	return fe.Kind != dataplane.NodePort || !fe.Addr.Unmap().IsLoopback()
}

// clusterIPMasquerade is the rule that marks traffic to a ClusterIP for
// masquerading at the head of its service chain, as kube-proxy writes it;
// "" when the Masquerade settings mark nothing.
func clusterIPMasquerade(masq netfilter.Masquerade, fam netfilter.Family, dest string) string {
	if masq.All {
		return dest + " jump " + chainMarkMasq
	}
	if notLocal := masq.Local.NFTNotLocal(fam); notLocal != "" {
		return dest + " " + notLocal + " jump " + chainMarkMasq
	}
	return ""
}

// backendSet is one distinct set of endpoints of a ServicePort in one
// family, and the chain that serves it ("" when empty).
type backendSet struct {
	backends []dataplane.Backend
	chain    string
	masq     []string
}

func (s *backendSet) empty() bool { return s == nil || len(s.backends) == 0 }

func (s *backendSet) markMasq(rule string) {
	if rule != "" && !slices.Contains(s.masq, rule) {
		s.masq = append(s.masq, rule)
	}
}

// policies are the distinct backend sets, external chains and firewall
// chains of one ServicePort. The set of its NodePort, external and
// load-balancer frontends (or failing those its first frontend's) gets
// the service chain, the next (the node-local endpoints of a Local
// policy) the local chain; the desired state has no more, but any further
// one is still served by a local chain whose hash covers its rank.
type policies struct {
	name dataplane.ServicePortName
	fam  netfilter.Family
	sets []*backendSet
	exts []*extChain
	fws  []*fwChain
}

func newPolicies(n dataplane.ServicePortName, fes []dataplane.Frontend, fam netfilter.Family) *policies {
	p := &policies{name: n, fam: fam}
	p.set(netfilter.ServiceChainBackends(fes))
	return p
}

// set returns the backendSet of backends, adding it when new.
func (p *policies) set(backends []dataplane.Backend) *backendSet {
	bs := netfilter.FamilyBackends(backends, p.fam)
	for _, s := range p.sets {
		if slices.Equal(s.backends, bs) {
			return s
		}
	}
	s := &backendSet{backends: bs}
	p.sets = append(p.sets, s)
	if len(bs) > 0 {
		rank := len(p.sets) - 1
		if rank == 0 {
			s.chain = portChain(prefixService, p.name, p.fam, 0)
		} else {
			s.chain = portChain(prefixLocal, p.name, p.fam, rank-1)
		}
	}
	return s
}

// extChain is an external chain: where traffic of the node and traffic
// from outside go.
type extChain struct {
	name               string
	internal, external *backendSet
	local              bool
}

func (p *policies) external(internal, external *backendSet, local bool) *extChain {
	for _, e := range p.exts {
		if e.internal == internal && e.external == external && e.local == local {
			return e
		}
	}
	e := &extChain{name: portChain(prefixExternal, p.name, p.fam, len(p.exts)), internal: internal, external: external, local: local}
	p.exts = append(p.exts, e)
	return e
}

// render renders the external chain; podLocal matches the traffic of
// this node's pods ("" when it is not told apart).
func (e *extChain) render(podLocal string) chain {
	c := chain{name: e.name}
	if !e.local {
		// Cluster policy: masquerade, since the endpoint may be on
		// another node and must answer through this one.
		c.rules = append(c.rules, "jump "+chainMarkMasq, "goto "+e.internal.chain)
		return c
	}
	// Local policy: traffic from outside keeps its source address and
	// stays on this node. A pod's traffic goes to every endpoint, as if it
	// had gone out to the load balancer and come back in, as kube-proxy
	// does; traffic of the node itself goes there too, masqueraded because
	// its source is a node address.
	if podLocal != "" && !e.internal.empty() {
		c.rules = append(c.rules, podLocal+" goto "+e.internal.chain)
	}
	c.rules = append(c.rules, "fib saddr type local jump "+chainMarkMasq)
	if e.internal.empty() {
		c.rules = append(c.rules, "fib saddr type local return")
	} else {
		c.rules = append(c.rules, "fib saddr type local goto "+e.internal.chain)
	}
	if !e.external.empty() {
		c.rules = append(c.rules, "goto "+e.external.chain)
	}
	return c
}

// fwChain is a firewall chain: the source ranges a load-balancer IP
// accepts. The load-balancer frontends of a ServicePort share one.
type fwChain struct {
	name   string
	ranges []netip.Prefix
}

func (p *policies) firewall(ranges []netip.Prefix) *fwChain {
	for _, f := range p.fws {
		if slices.Equal(f.ranges, ranges) {
			return f
		}
	}
	f := &fwChain{name: portChain(prefixFirewall, p.name, p.fam, len(p.fws)), ranges: ranges}
	p.fws = append(p.fws, f)
	return f
}

func (f *fwChain) render(word string) chain {
	rs := make([]string, len(f.ranges))
	for i, r := range f.ranges {
		rs[i] = r.String()
	}
	return chain{name: f.name, rules: []string{word + " saddr != { " + strings.Join(rs, ", ") + " } drop"}}
}

// vmapFromEndpoints is the number of endpoints from which a chain picks
// one through an anonymous verdict map rather than a rule per endpoint.
// The kernel names every anonymous set afresh by scanning all the sets of
// the table, so a map per Service makes a full write grow with the square
// of the Services: 110 s for 10,000 Services on Linux 6.18, against 7 s
// with rules. Rules cost a new connection one numgen per endpoint passed,
// which the map saves only where a Service has many endpoints.
const vmapFromEndpoints = 64

// pickEndpoint is the rules that send a packet to one of backends at
// random, each as likely as the others.
func pickEndpoint(n dataplane.ServicePortName, backends []dataplane.Backend) []string {
	if len(backends) < vmapFromEndpoints {
		// Rule i is taken with probability 1/(n-i) by the packets that
		// reach it, as iptables' statistic rules in kube-proxy's
		// iptables mode; the last one always.
		rules := make([]string, 0, len(backends))
		for i, b := range backends[:len(backends)-1] {
			rules = append(rules, "numgen random mod "+strconv.Itoa(len(backends)-i)+" == 0 goto "+endpointChain(n, b))
		}
		return append(rules, "goto "+endpointChain(n, backends[len(backends)-1]))
	}
	vmap := make([]string, len(backends))
	for i, b := range backends {
		vmap[i] = strconv.Itoa(i) + " : goto " + endpointChain(n, b)
	}
	return []string{
		"numgen random mod " + strconv.Itoa(len(backends)) + " vmap { " + strings.Join(vmap, " , ") + " }",
		// A packet that starts down this chain just before a commit
		// replaces it keeps the old rules but looks the old rule's
		// anonymous map up with the new generation, where its elements
		// are already gone: the vmap misses and, without this rule, the
		// packet would leave untranslated. It goes to the first endpoint
		// of the rules it started with instead.
		"goto " + endpointChain(n, backends[0]),
	}
}

// render adds the service and local chains of every non-empty set, the
// endpoint chains they go to and the affinity sets, in the order of the
// sets. A chain without affinity and with fewer than vmapFromEndpoints
// endpoints DNATs itself, as kube-proxy's nftables mode does since 1.37,
// and its endpoints go in the hairpin set instead of chains of their own:
// nft reads every chain of the table before any write that adds a rule,
// and the kernel restarts that dump on every receive, so at 10,000
// Services 110,000 chains cost 0.8 s a sync where 10,000 cost 0.08 s.
func (p *policies) render(sp *dataplane.ServicePort, word, proto string, out *portRules) {
	timeout := dataplane.AffinitySeconds(sp.AffinityTimeout)
	seen := map[dataplane.Backend]bool{}
	hairpin := map[dataplane.Backend]bool{}
	var eps []dataplane.Backend
	for _, s := range p.sets {
		if s.empty() {
			continue
		}
		c := chain{name: s.chain, rules: slices.Clone(s.masq)}
		if timeout == 0 && len(s.backends) < vmapFromEndpoints {
			c.rules = append(c.rules, dnatToOne(word, proto, s.backends)...)
			out.chains = append(out.chains, c)
			for _, b := range s.backends {
				if !hairpin[b] {
					hairpin[b] = true
					a := b.Addr.String()
					out.hairpin = append(out.hairpin, element{m: mapOf(setHairpin, p.fam), key: []string{a, a, proto, strconv.Itoa(int(b.Port))}})
				}
			}
			continue
		}
		if timeout > 0 {
			for _, b := range s.backends {
				c.rules = append(c.rules, word+" saddr @"+affinitySet(sp.Name, b, timeout)+" goto "+endpointChain(sp.Name, b))
			}
		}
		for _, b := range s.backends {
			if !seen[b] {
				seen[b] = true
				eps = append(eps, b)
			}
		}
		c.rules = append(c.rules, pickEndpoint(sp.Name, s.backends)...)
		out.chains = append(out.chains, c)
	}
	for _, b := range eps {
		c := chain{name: endpointChain(sp.Name, b)}
		// Hairpin: an endpoint reaching itself through the Service must
		// be masqueraded, or it answers itself directly.
		c.rules = append(c.rules, word+" saddr "+b.Addr.String()+" jump "+chainMarkMasq)
		if timeout > 0 {
			set := affinitySet(sp.Name, b, timeout)
			out.sets = append(out.sets, affinity{name: set, timeout: timeout})
			c.rules = append(c.rules, "update @"+set+" { "+word+" saddr }")
		}
		c.rules = append(c.rules, "meta l4proto "+proto+" dnat "+word+" to "+dnatTarget(b))
		out.chains = append(out.chains, c)
	}
}

// dnatToOne is the rules that DNAT a packet to one of backends at
// random, each as likely as the others: rule i is taken with probability
// 1/(n-i) by the packets that reach it, the last one always.
func dnatToOne(word, proto string, backends []dataplane.Backend) []string {
	rules := make([]string, 0, len(backends))
	for i, b := range backends {
		draw := ""
		if i < len(backends)-1 {
			draw = "numgen random mod " + strconv.Itoa(len(backends)-i) + " == 0 "
		}
		rules = append(rules, "meta l4proto "+proto+" "+draw+"dnat "+word+" to "+dnatTarget(b))
	}
	return rules
}
