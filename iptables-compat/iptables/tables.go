package iptables

import (
	"slices"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The two tables the backend writes, each in a transaction of its own: an
// iptables-restore of one table is atomic, one of several is not (each
// table commits on its own).
const (
	tableFilter = "filter"
	tableNAT    = "nat"
)

// tables are the tables the backend reads and writes; writeSteps orders
// the transactions of one call.
var tables = []string{tableFilter, tableNAT}

// jumpRule is a base jump with kube-proxy's comment, so that either
// finds the other's.
func jumpRule(table, builtin, match, text, target string) netfilter.BaseJump {
	return netfilter.BaseJump{Table: table, Chain: builtin, Match: match, Comment: text, Target: target}
}

const newConn = "-m conntrack --ctstate NEW"

var baseJumps = []netfilter.BaseJump{
	jumpRule(tableNAT, "PREROUTING", "", "kubernetes service portals", chainServices),
	jumpRule(tableNAT, "OUTPUT", "", "kubernetes service portals", chainServices),
	jumpRule(tableNAT, "POSTROUTING", "", "kubernetes postrouting rules", chainPostrouting),
	jumpRule(tableFilter, "INPUT", newConn, "kubernetes externally-visible service portals", chainExternalServices),
	jumpRule(tableFilter, "FORWARD", newConn, "kubernetes externally-visible service portals", chainExternalServices),
	jumpRule(tableFilter, "FORWARD", newConn, "kubernetes service portals", chainServices),
	jumpRule(tableFilter, "OUTPUT", newConn, "kubernetes service portals", chainServices),
	jumpRule(tableFilter, "FORWARD", "", "kubernetes forwarding rules", chainForward),
	jumpRule(tableFilter, "INPUT", newConn, "kubernetes load balancer firewall", chainProxyFirewall),
	jumpRule(tableFilter, "OUTPUT", newConn, "kubernetes load balancer firewall", chainProxyFirewall),
	jumpRule(tableFilter, "FORWARD", newConn, "kubernetes load balancer firewall", chainProxyFirewall),
}

// firewallJumps are the kubelet's jumps to KUBE-FIREWALL, without a
// comment as the kubelet writes them, so that either finds the other's.
var firewallJumps = []netfilter.BaseJump{
	jumpRule(tableFilter, "INPUT", "", "", chainFirewall),
	jumpRule(tableFilter, "OUTPUT", "", "", chainFirewall),
}

// baseJumpsOf are the base jumps of fam under cfg.
func baseJumpsOf(fam netfilter.Family, cfg config) []netfilter.BaseJump {
	if firewallChainOf(fam, cfg) {
		return slices.Concat(baseJumps, firewallJumps)
	}
	return baseJumps
}

// config is what of the Options shapes the rules besides the ServicePorts.
type config struct {
	masq netfilter.Masquerade
	// localhostNodePorts is Options.LocalhostNodePorts.
	localhostNodePorts bool
	// tcpLiberal is Options.ConntrackTCPLiberal.
	tcpLiberal bool
}

// firewallChainOf reports whether the Plane writes KUBE-FIREWALL in fam:
// where route_localnet lets packets to 127.0.0.0/8 be routed, which IPv6
// has no equivalent of.
func firewallChainOf(fam netfilter.Family, cfg config) bool {
	return fam == netfilter.IPv4 && cfg.localhostNodePorts
}

// sharedChain is a chain the rules of many ServicePorts go into. A sync
// that reads the tables first (the first one, and every full one) writes
// each shared chain whole; a partial sync writes one only when a changed
// ServicePort's lines in it changed. So an endpoint change, which touches
// only the Service's own chains, leaves KUBE-SERVICES alone: at 1,000
// Services that chain is most of what a restore would otherwise rewrite.
type sharedChain struct {
	table, name string
	// head and tail are the chain's fixed rules, before and after the
	// ServicePorts' lines; nil for none.
	head, tail func(fam netfilter.Family, cfg config) []string
	// lines are one ServicePort's rules in the chain; nil for a chain
	// that has only fixed rules.
	lines func(r *portRules) []string
	// when says whether the Plane writes the chain in fam under cfg; nil
	// is always.
	when func(fam netfilter.Family, cfg config) bool
	// kubelets is a chain the kubelet writes too, with the same rules:
	// Cleanup leaves it, as kube-proxy's cleanup does.
	kubelets bool
}

// sharedChainList is every shared chain, in the order a full sync writes
// them.
var sharedChainList = []sharedChain{
	{table: tableNAT, name: chainServices, lines: func(r *portRules) []string { return r.natServices }, tail: nodePortsJump},
	{table: tableNAT, name: chainNodePorts, lines: func(r *portRules) []string { return r.natNodePorts }},
	{table: tableNAT, name: chainPostrouting, head: fixed(
		"-A "+chainPostrouting+" -m mark ! --mark "+masqMark+"/"+masqMark+" -j RETURN",
		// The mark is cleared so a packet masqueraded here is not
		// masqueraded again if it re-enters netfilter.
		"-A "+chainPostrouting+" -j MARK --xor-mark "+masqMark,
		"-A "+chainPostrouting+" "+netfilter.Comment("kubernetes service traffic requiring SNAT")+" -j MASQUERADE --random-fully")},
	{table: tableNAT, name: chainMarkMasq, head: fixed("-A " + chainMarkMasq + " -j MARK --or-mark " + masqMark)},
	{table: tableFilter, name: chainServices, lines: func(r *portRules) []string { return r.filterServices }},
	{table: tableFilter, name: chainExternalServices, lines: func(r *portRules) []string { return r.filterExternal }},
	{table: tableFilter, name: chainForward, head: forwardRules},
	{table: tableFilter, name: chainProxyFirewall, lines: func(r *portRules) []string { return r.filterFirewall }},
	{table: tableFilter, name: chainFirewall, when: firewallChainOf, kubelets: true, head: fixed(
		// route_localnet, which NodePorts on 127.0.0.1 need, also lets a
		// neighbour on any link send packets to 127.0.0.0/8 and reach
		// what listens on the node's loopback only (CVE-2020-8558). Only
		// packets from 127.0.0.0/8, replies, and what was DNATed to a
		// NodePort's endpoint may arrive there.
		"-A " + chainFirewall + " " + netfilter.Comment("block incoming localnet connections") +
			" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP")},
}

func fixed(rules ...string) func(netfilter.Family, config) []string {
	return func(netfilter.Family, config) []string { return rules }
}

// forwardRules head KUBE-FORWARD. Packets conntrack calls INVALID are
// dropped first (kubernetes#74839): a TCP segment outside the window of
// a DNATed connection would otherwise be forwarded untranslated, with the
// endpoint's address, and the client resets the connection. Where
// nf_conntrack_tcp_be_liberal is set only out-of-window RSTs are INVALID
// and the rule is left out, as kube-proxy does.
func forwardRules(_ netfilter.Family, cfg config) []string {
	var out []string
	if !cfg.tcpLiberal {
		out = append(out, "-A "+chainForward+" -m conntrack --ctstate INVALID -j DROP")
	}
	return append(out,
		"-A "+chainForward+" "+netfilter.Comment("kubernetes forwarding rules")+" -m mark --mark "+masqMark+"/"+masqMark+" -j ACCEPT",
		"-A "+chainForward+" "+netfilter.Comment("kubernetes forwarding conntrack rule")+" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
}

// nodePortsJump ends nat KUBE-SERVICES: traffic to a local address that no
// Service rule took may be for a NodePort.
func nodePortsJump(fam netfilter.Family, _ config) []string {
	tail := "-A " + chainServices + " " + netfilter.Comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain") +
		" -m addrtype --dst-type LOCAL"
	if fam == netfilter.IPv6 {
		tail += " ! -d ::1/128"
	}
	return []string{tail + " -j " + chainNodePorts}
}

// sharedChainsOf returns the shared chains the Plane writes into table
// of fam under cfg.
func sharedChainsOf(table string, fam netfilter.Family, cfg config) []sharedChain {
	var out []sharedChain
	for _, c := range sharedChainList {
		if c.table == table && (c.when == nil || c.when(fam, cfg)) {
			out = append(out, c)
		}
	}
	return out
}

// sharedChains returns the names of the shared chains the Plane writes
// into table of fam under cfg.
func sharedChains(table string, fam netfilter.Family, cfg config) []string {
	var out []string
	for _, c := range sharedChainsOf(table, fam, cfg) {
		out = append(out, c.name)
	}
	return out
}

// ownSharedChain reports whether chain is a shared chain of table that
// is the backend's alone (not also the kubelet's).
func ownSharedChain(table, chain string) bool {
	return slices.ContainsFunc(sharedChainList, func(c sharedChain) bool {
		return c.table == table && c.name == chain && !c.kubelets
	})
}

// changedIn reports whether a ServicePort's lines in c differ between two
// renderings of it (nil for none).
func (c sharedChain) changedIn(a, b *portRules) bool {
	if c.lines == nil {
		return false
	}
	return !slices.Equal(linesOf(c, a), linesOf(c, b))
}

func linesOf(c sharedChain, r *portRules) []string {
	if r == nil {
		return nil
	}
	return c.lines(r)
}

// tableInput is what one transaction writes.
type tableInput struct {
	fam   netfilter.Family
	table string
	cfg   config
	// ports are every ServicePort's rules, in name order: a shared chain
	// that is written is written whole.
	ports []*portRules
	// shared are the shared chains to write.
	shared []sharedChain
	// rewrite are the ServicePorts whose own chains are written.
	rewrite []*portRules
	// remove are chains to delete: owned by a rewritten ServicePort
	// before and not now, or, in a full sync, by none.
	remove []string
	// jumps are base jumps to insert because the table lacks them.
	jumps []netfilter.BaseJump
}

// writesNothing reports whether the transaction would leave the table as
// it is, so that it need not run.
func (in tableInput) writesNothing() bool {
	return len(in.shared) == 0 && len(in.rewrite) == 0 && len(in.remove) == 0 && len(in.jumps) == 0
}

// rewriteLines is how many lines the rewritten ServicePorts' chains take.
func (in tableInput) rewriteLines() int {
	n := 0
	for _, p := range in.rewrite {
		n += p.chainLines()
	}
	return n
}

// split divides in into transactions that write at most max lines of
// per-ServicePort chains each, cut at ServicePort boundaries, so that each
// ServicePort's own chains change in one transaction:
//   - the first also writes the shared chains that have only fixed rules
//     (KUBE-MARK-MASQ, which the ServicePorts' chains jump to, so it must
//     exist before them);
//   - then the ServicePorts' own chains;
//   - the last writes the other shared chains, the base jumps and the
//     deletions, once nothing jumps to what it deletes.
//
// Between two parts a ServicePort may be reached through its old entries
// in the shared chains and served by its new chains; a failed part is
// undone by writing the old state back the same way (see Plane.write).
// An input that fits is returned as it is.
func (in tableInput) split(max int) []tableInput {
	if max <= 0 || in.rewriteLines() <= max {
		return []tableInput{in}
	}
	part := func() tableInput { return tableInput{fam: in.fam, table: in.table, cfg: in.cfg, ports: in.ports} }
	last := part()
	last.remove, last.jumps = in.remove, in.jumps
	first := part()
	for _, c := range in.shared {
		if c.lines == nil {
			first.shared = append(first.shared, c)
		} else {
			last.shared = append(last.shared, c)
		}
	}
	parts := []tableInput{first}
	lines := 0
	for _, p := range in.rewrite {
		n := p.chainLines()
		if lines > 0 && lines+n > max {
			parts = append(parts, part())
			lines = 0
		}
		cur := &parts[len(parts)-1]
		cur.rewrite = append(cur.rewrite, p)
		lines += n
	}
	if last.writesNothing() {
		return parts // a partial sync that changes no shared chain and deletes nothing
	}
	return append(parts, last)
}

// render returns the iptables-restore --noflush input. Declaring a chain
// creates it or flushes it; chains not declared are left as they are, so a
// partial sync leaves unchanged chains alone. The shared chains come
// first, deletions last, when nothing jumps to them any more.
func (in tableInput) render() []byte {
	return netfilter.Restore(in.table, in.write)
}

// eachLine calls fn with each line of the input, in order, without the
// input in memory at once (at 10,000 Services it is 40 MB).
func (in tableInput) eachLine(fn func(string)) {
	netfilter.WriteRestore(in.table, fn, in.write)
}

// write is the body of the input, between the table's header and COMMIT.
func (in tableInput) write(w netfilter.RestoreInput) {
	for _, c := range in.shared {
		w.Declare(c.name)
	}
	for _, p := range in.rewrite {
		for _, c := range p.chains {
			w.Declare(c.name)
		}
	}
	for _, c := range in.remove {
		w.Declare(c)
	}
	for _, j := range in.jumps {
		w.InsertJump(j)
	}
	for _, c := range in.shared {
		if c.head != nil {
			w.Rules(c.head(in.fam, in.cfg))
		}
		if c.lines != nil {
			for _, p := range in.ports {
				w.Rules(c.lines(p))
			}
		}
		if c.tail != nil {
			w.Rules(c.tail(in.fam, in.cfg))
		}
	}
	for _, p := range in.rewrite {
		for _, c := range p.chains {
			w.Rules(c.rules)
		}
	}
	for _, c := range in.remove {
		w.DeleteChain(c)
	}
}

// staleChains are the chains of saved that look like the backend's
// per-ServicePort chains and that none of ports owns.
func staleChains(saved *netfilter.SavedTable, ports []*portRules) []string {
	if saved == nil {
		return nil
	}
	owned := map[string]bool{}
	for _, p := range ports {
		for _, c := range p.chains {
			owned[c.name] = true
		}
	}
	var out []string
	for _, c := range saved.Chains {
		if ownedChain(c) && !owned[c] {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}
