package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// chain is one per-ServicePort nat chain: its name and its rules, each a
// complete "-A <name> ..." line of iptables-restore input.
type chain struct {
	name  string
	rules []string
}

// portRules is what one ServicePort contributes to one family's tables:
// its lines in the shared chains, which every sync rewrites in full, and
// the chains it owns, which a partial sync rewrites only when it changed.
type portRules struct {
	natServices    []string // nat KUBE-SERVICES
	natNodePorts   []string // nat KUBE-NODEPORTS
	filterServices []string // filter KUBE-SERVICES: reject without endpoints
	filterExternal []string // filter KUBE-EXTERNAL-SERVICES: reject or drop of outside traffic
	filterFirewall []string // filter KUBE-PROXY-FIREWALL: drop of what KUBE-FW-* did not let through
	chains         []chain
}

func (r *portRules) chainNames() []string {
	out := make([]string, len(r.chains))
	for i, c := range r.chains {
		out[i] = c.name
	}
	return out
}

// chainLines is how many restore lines the ServicePort's own chains take:
// a declaration each, and their rules.
func (r *portRules) chainLines() int {
	n := 0
	for _, c := range r.chains {
		n += 1 + len(c.rules)
	}
	return n
}

// line joins the words of one restore line.
func line(words ...string) string { return strings.Join(words, " ") }

// comment is the comment match kube-proxy puts on its rules; quoted, as
// iptables-restore reads it.
// renderPort renders the frontends of sp that belong to fam. It is pure:
// the same ServicePort always renders to the same lines.
//
// The chain structure follows kube-proxy's iptables mode:
//   - a ClusterIP jumps from KUBE-SERVICES to its policy chain;
//   - a NodePort (from KUBE-NODEPORTS), an external IP or a load-balancer
//     IP (from KUBE-SERVICES) jumps to KUBE-EXT-*, which masquerades and
//     picks the policy chain: KUBE-SVC-* (every endpoint) for traffic of
//     the node itself, and for traffic from outside too under
//     externalTrafficPolicy Cluster; under Local, outside traffic goes to
//     KUBE-SVL-* (node-local endpoints) and keeps its source address;
//   - a policy chain spreads new connections over KUBE-SEP-* chains with
//     statistic --mode random, first checking the recent lists of ClientIP
//     affinity; each KUBE-SEP-* DNATs to one endpoint;
//   - a frontend without endpoints is rejected in filter KUBE-SERVICES,
//     outside traffic under a Local policy without local endpoints dropped
//     in filter KUBE-EXTERNAL-SERVICES;
//   - a load-balancer IP with loadBalancerSourceRanges of its family (and
//     endpoints) jumps to KUBE-FW-* instead, which sends sources inside the
//     ranges on to KUBE-EXT-*; the rest leave nat undrafted and are dropped
//     by filter KUBE-PROXY-FIREWALL, which matches the load-balancer IP and
//     port (a DNATed packet no longer has them).
//
// kpr's frontends carry their addresses, NodePorts too, so every rule
// matches its destination address (kube-proxy matches NodePorts by port
// on every local address).
func renderPort(sp *dataplane.ServicePort, fam netfilter.Family, cfg config) portRules {
	var out portRules
	name := portName(sp.Name)
	proto := netfilter.ProtoName(sp.Name.Protocol)

	var fes []dataplane.Frontend
	for _, fe := range sp.Frontends {
		if netfilter.FamilyOf(fe.Addr) == fam && servable(fe, cfg.localhostNodePorts) {
			fes = append(fes, fe)
		}
	}
	if len(fes) == 0 {
		return out
	}
	pol := newPolicies(sp.Name, fes, fam)

	for _, fe := range fes {
		internal := pol.set(fe.Backends)
		external := internal
		if fe.ExternalBackends != nil {
			external = pol.set(fe.ExternalBackends)
		}
		// A ClusterIP that treats every origin alike jumps straight to its
		// policy chain, as in kube-proxy; everything else enters through
		// KUBE-EXT-*.
		local := fe.ExternalBackends != nil
		direct := fe.Kind == dataplane.ClusterIP && !local
		dest := []string{"-m", proto, "-p", proto, "-d", fe.Addr.Unmap().String(), "--dport", strconv.Itoa(int(fe.Port))}

		if fe.Kind == dataplane.ClusterIP && !internal.empty() {
			internal.markMasq(clusterIPMasquerade(cfg.masq, fam, name, dest))
		}
		if !internal.empty() || !external.empty() {
			target := internal.chain
			if !direct {
				target = pol.external(internal, external, local).name
			}
			if ranges := sp.SourceRangesFor(fe); len(ranges) > 0 {
				fw := pol.firewall(target, ranges)
				target = fw.name
				out.filterFirewall = append(out.filterFirewall,
					line("-A", chainProxyFirewall, netfilter.Comment(name+" traffic not accepted by "+fw.name), line(dest...), "-j", "DROP"))
			}
			switch fe.Kind {
			case dataplane.NodePort:
				out.natNodePorts = append(out.natNodePorts, line("-A", chainNodePorts, netfilter.Comment(name), line(dest...), "-j", target))
			default:
				out.natServices = append(out.natServices,
					line("-A", chainServices, netfilter.Comment(name+" "+kindComment(fe.Kind)), line(dest...), "-j", target))
			}
		}
		if internal.empty() {
			out.filterServices = append(out.filterServices,
				line("-A", chainServices, netfilter.Comment(name+" has no endpoints"), line(dest...), "-j", "REJECT"))
		}
		if external.empty() && !direct {
			target, why := "DROP", " has no local endpoints"
			if internal.empty() {
				target, why = "REJECT", " has no endpoints"
			}
			out.filterExternal = append(out.filterExternal,
				line("-A", chainExternalServices, netfilter.Comment(name+why), line(dest...), "-j", target))
		}
	}

	for _, f := range pol.fws {
		out.chains = append(out.chains, f.render(name))
	}
	for _, e := range pol.exts {
		out.chains = append(out.chains, e.render(name, cfg.masq.Local.IPTablesLocal(fam)))
	}
	out.chains = append(out.chains, pol.chains(sp, name, proto)...)
	return out
}

// servable reports whether the iptables dataplane serves fe. IPv6
// loopback NodePorts cannot be served: the kernel has no route_localnet
// for IPv6, so a packet from ::1 DNATed to a pod is dropped (kube-proxy
// leaves them out for the same reason). IPv4 loopback ones are served
// only with localhost NodePorts (Options.LocalhostNodePorts), as under
// kube-proxy's --iptables-localhost-nodeports.
func servable(fe dataplane.Frontend, localhostNodePorts bool) bool {
	if fe.Kind != dataplane.NodePort {
		return true
	}
	a := fe.Addr.Unmap()
	return !a.IsLoopback() || (a.Is4() && localhostNodePorts)
}

func kindComment(k dataplane.FrontendKind) string {
	switch k {
	case dataplane.ExternalIP:
		return "external IP"
	case dataplane.LoadBalancer:
		return "loadbalancer IP"
	}
	return "cluster IP"
}

// backendSet is one distinct set of endpoints of a ServicePort in one
// family, and the policy chain that serves it ("" when empty).
type backendSet struct {
	backends []dataplane.Backend // sorted, of the family only
	chain    string
	// masq are the words of the rules that open the chain and mark
	// ClusterIP traffic for masquerading (see Masquerade).
	masq [][]string
}

// markMasq adds a masquerade rule to the set's chain, once.
func (s *backendSet) markMasq(words []string) {
	if words == nil {
		return
	}
	for _, w := range s.masq {
		if slices.Equal(w, words) {
			return
		}
	}
	s.masq = append(s.masq, words)
}

// clusterIPMasquerade is the rule that marks traffic to a ClusterIP for
// masquerading, as kube-proxy writes it at the head of the Service's
// internal chain; nil when masq marks nothing.
func clusterIPMasquerade(masq netfilter.Masquerade, fam netfilter.Family, name string, dest []string) []string {
	words := append([]string{netfilter.Comment(name + " cluster IP")}, dest...)
	if masq.All {
		return append(words, "-j", chainMarkMasq)
	}
	if notLocal := masq.Local.IPTablesNotLocal(fam); notLocal != nil {
		return append(append(words, notLocal...), "-j", chainMarkMasq)
	}
	return nil
}

func (s *backendSet) empty() bool { return s == nil || len(s.backends) == 0 }

// policies are the distinct backend sets the frontends of one ServicePort
// use, with their chains. The set of the ServicePort's NodePort, external
// and load-balancer frontends (the cluster-wide endpoints), or failing
// those of its first frontend, gets KUBE-SVC-*; the next distinct set (the
// node-local endpoints of a Local traffic policy) gets KUBE-SVL-*. The
// desired state never has more than these two; any further set is still
// served, by a KUBE-SVL-* chain whose hash also covers its rank.
type policies struct {
	name dataplane.ServicePortName
	fam  netfilter.Family
	sets []*backendSet
	exts []*extChain
	fws  []*fwChain
}

// fwChain is a KUBE-FW-* chain: the source ranges that may go on to an
// external chain. The load-balancer frontends of one ServicePort share
// one, as they share their ranges and KUBE-EXT-* chain.
type fwChain struct {
	name   string
	next   string
	ranges []netip.Prefix
}

// firewall returns the fwChain that lets ranges through to next, adding
// it when new.
func (p *policies) firewall(next string, ranges []netip.Prefix) *fwChain {
	for _, f := range p.fws {
		if f.next == next && slices.Equal(f.ranges, ranges) {
			return f
		}
	}
	f := &fwChain{name: firewallChain(p.name), next: next, ranges: ranges}
	if rank := len(p.fws); rank > 0 {
		f.name = prefixFirewall + hash16(portName(p.name)+netfilter.ProtoName(p.name.Protocol)+"#"+strconv.Itoa(rank))
	}
	p.fws = append(p.fws, f)
	return f
}

// render renders the KUBE-FW-* chain as kube-proxy does: one rule per
// range, then a rule without a target that only counts what falls
// through to KUBE-PROXY-FIREWALL.
func (f *fwChain) render(name string) chain {
	c := chain{name: f.name}
	for _, r := range f.ranges {
		c.rules = append(c.rules, line("-A", c.name, netfilter.Comment(name+" loadbalancer IP"), "-s", r.String(), "-j", f.next))
	}
	c.rules = append(c.rules, line("-A", c.name, netfilter.Comment("other traffic to "+name+" will be dropped by "+chainProxyFirewall)))
	return c
}

// extChain is a KUBE-EXT-* chain: the backend sets it sends traffic of
// the node and traffic from outside to. The frontends of one ServicePort
// share one pair in the desired state, so there is one such chain; any
// further pair gets a chain whose hash also covers its rank.
type extChain struct {
	name               string
	internal, external *backendSet
	// local is externalTrafficPolicy Local: outside traffic keeps its
	// source address.
	local bool
}

// external returns the extChain of the pair, adding it when new.
func (p *policies) external(internal, external *backendSet, local bool) *extChain {
	for _, e := range p.exts {
		if e.internal == internal && e.external == external && e.local == local {
			return e
		}
	}
	e := &extChain{name: externalChain(p.name), internal: internal, external: external, local: local}
	if rank := len(p.exts); rank > 0 {
		e.name = prefixExternal + hash16(portName(p.name)+netfilter.ProtoName(p.name.Protocol)+"#"+strconv.Itoa(rank))
	}
	p.exts = append(p.exts, e)
	return e
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
		s.chain = p.chainName(len(p.sets) - 1)
	}
	return s
}

func (p *policies) chainName(rank int) string {
	switch rank {
	case 0:
		return clusterChain(p.name)
	case 1:
		return localChain(p.name)
	}
	return prefixLocalPolicy + hash16(portName(p.name)+netfilter.ProtoName(p.name.Protocol)+"#"+strconv.Itoa(rank))
}

// render renders the KUBE-EXT-* chain; podLocal matches the traffic of
// this node's pods (nil when it is not told apart).
func (e *extChain) render(name string, podLocal []string) chain {
	c := chain{name: e.name}
	add := func(words ...string) { c.rules = append(c.rules, line(append([]string{"-A", c.name}, words...)...)) }
	if !e.local {
		// Cluster policy: masquerade, since the endpoint may be on
		// another node and must answer through this one.
		add(netfilter.Comment("masquerade traffic for "+name+" external destinations"), "-j", chainMarkMasq)
		add("-j", e.internal.chain)
		return c
	}
	// Local policy: traffic from outside keeps its source address and
	// stays on this node. A pod's traffic goes to every endpoint, as if it
	// had gone out to the load balancer and come back in, as kube-proxy
	// does. Traffic of the node itself goes there too, masqueraded because
	// its source is a node address.
	if podLocal != nil && !e.internal.empty() {
		add(netfilter.Comment("pod traffic for "+name+" external destinations"), line(podLocal...), "-j", e.internal.chain)
	}
	add(netfilter.Comment("masquerade LOCAL traffic for "+name+" external destinations"), "-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq)
	if e.internal.empty() {
		add(netfilter.Comment("no endpoints for LOCAL traffic to "+name+" external destinations"), "-m", "addrtype", "--src-type", "LOCAL", "-j", "RETURN")
	} else {
		add(netfilter.Comment("route LOCAL traffic for "+name+" external destinations"), "-m", "addrtype", "--src-type", "LOCAL", "-j", e.internal.chain)
	}
	if !e.external.empty() {
		add("-j", e.external.chain)
	}
	return c
}

// chains renders the policy chains of every non-empty set and the endpoint
// chains they jump to, in the order of the sets.
func (p *policies) chains(sp *dataplane.ServicePort, name, proto string) []chain {
	var out []chain
	affinity := dataplane.AffinitySeconds(sp.AffinityTimeout)
	seps := map[dataplane.Backend]bool{}
	var sepOrder []dataplane.Backend
	for _, s := range p.sets {
		if s.empty() {
			continue
		}
		c := chain{name: s.chain}
		add := func(words ...string) { c.rules = append(c.rules, line(append([]string{"-A", c.name}, words...)...)) }
		for _, words := range s.masq {
			add(words...)
		}
		if affinity > 0 {
			for _, b := range s.backends {
				sep := endpointChain(sp.Name, b)
				add(netfilter.Comment(name+" -> "+b.String()), "-m", "recent", "--name", sep, "--rcheck", "--seconds", strconv.FormatUint(uint64(affinity), 10), "--reap", "-j", sep)
			}
		}
		for i, b := range s.backends {
			words := []string{netfilter.Comment(name + " -> " + b.String())}
			if left := len(s.backends) - i; left > 1 {
				words = append(words, "-m", "statistic", "--mode", "random", "--probability", probability(left))
			}
			add(append(words, "-j", endpointChain(sp.Name, b))...)
			if !seps[b] {
				seps[b] = true
				sepOrder = append(sepOrder, b)
			}
		}
		out = append(out, c)
	}
	for _, b := range sepOrder {
		c := chain{name: endpointChain(sp.Name, b)}
		add := func(words ...string) { c.rules = append(c.rules, line(append([]string{"-A", c.name}, words...)...)) }
		// Hairpin: an endpoint reaching itself through the Service must
		// be masqueraded, or it answers itself directly.
		add(netfilter.Comment(name), "-s", b.Addr.String(), "-j", chainMarkMasq)
		dnat := []string{netfilter.Comment(name)}
		if affinity > 0 {
			dnat = append(dnat, "-m", "recent", "--name", c.name, "--set")
		}
		add(append(dnat, "-m", proto, "-p", proto, "-j", "DNAT", "--to-destination", b.String())...)
		out = append(out, c)
	}
	return out
}

// probability is the chance that a rule picks the first of left remaining
// endpoints, so that each is picked equally often; kube-proxy's format.
func probability(left int) string { return fmt.Sprintf("%0.10f", 1.0/float64(left)) }
