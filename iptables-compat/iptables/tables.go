package iptables

import (
	"bytes"
	"slices"
)

// The two tables the backend writes, each in a transaction of its own: an
// iptables-restore of one table is atomic, one of several is not (each
// table commits on its own).
const (
	tableFilter = "filter"
	tableNAT    = "nat"
)

// tables is the order of the transactions of one family.
var tables = []string{tableFilter, tableNAT}

// baseJump is a rule in a built-in chain that sends traffic to one of the
// backend's chains; kube-proxy's, with its comments, so that either finds
// the other's.
type baseJump struct {
	table, chain string
	// args follow "-A <chain>", as restore input.
	args string
	// target and comment identify the rule in iptables-save output, which
	// reorders and respells matches.
	target, comment string
}

func jumpRule(table, builtin, match, text, target string) baseJump {
	args := comment(text) + " -j " + target
	if match != "" {
		args = match + " " + args
	}
	return baseJump{table: table, chain: builtin, args: args, target: target, comment: text}
}

const newConn = "-m conntrack --ctstate NEW"

var baseJumps = []baseJump{
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

// missingJumps returns the base jumps of table that saved lacks.
func missingJumps(table string, saved *savedTable) []baseJump {
	var out []baseJump
	for _, j := range baseJumps {
		if j.table == table && !saved.hasJump(j) {
			out = append(out, j)
		}
	}
	return out
}

// tableInput is what one transaction writes.
type tableInput struct {
	fam   Family
	table string
	// ports are every ServicePort's rules, in name order: the shared
	// chains are rewritten in full by every transaction.
	ports []*portRules
	// rewrite are the ServicePorts whose own chains are written.
	rewrite []*portRules
	// remove are chains to delete: owned by a rewritten ServicePort
	// before and not now, or, in a full sync, by none.
	remove []string
	// jumps are base jumps to insert because the table lacks them.
	jumps []baseJump
}

// render returns the iptables-restore --noflush input. Declaring a chain
// creates it or flushes it; chains not declared are left as they are, so a
// partial sync leaves unchanged ServicePorts' chains alone. The shared
// chains come first, deletions last, when nothing jumps to them any more.
func (in tableInput) render() []byte {
	var b bytes.Buffer
	ln := func(s string) { b.WriteString(s); b.WriteByte('\n') }
	declare := func(name string) { ln(":" + name + " - [0:0]") }
	ln("*" + in.table)
	switch in.table {
	case tableNAT:
		for _, c := range []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq} {
			declare(c)
		}
		for _, p := range in.rewrite {
			for _, c := range p.chains {
				declare(c.name)
			}
		}
	case tableFilter:
		for _, c := range sharedChains(tableFilter) {
			declare(c)
		}
	}
	for _, c := range in.remove {
		declare(c)
	}
	for _, j := range in.jumps {
		ln("-I " + j.chain + " " + j.args)
	}
	switch in.table {
	case tableNAT:
		ln("-A " + chainPostrouting + " -m mark ! --mark " + masqMark + "/" + masqMark + " -j RETURN")
		// The mark is cleared so a packet masqueraded here is not
		// masqueraded again if it re-enters netfilter.
		ln("-A " + chainPostrouting + " -j MARK --xor-mark " + masqMark)
		ln("-A " + chainPostrouting + " " + comment("kubernetes service traffic requiring SNAT") + " -j MASQUERADE --random-fully")
		ln("-A " + chainMarkMasq + " -j MARK --or-mark " + masqMark)
		for _, p := range in.ports {
			for _, r := range p.natServices {
				ln(r)
			}
		}
		tail := "-A " + chainServices + " " + comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain") +
			" -m addrtype --dst-type LOCAL"
		if in.fam == IPv6 {
			tail += " ! -d ::1/128"
		}
		ln(tail + " -j " + chainNodePorts)
		for _, p := range in.ports {
			for _, r := range p.natNodePorts {
				ln(r)
			}
		}
		for _, p := range in.rewrite {
			for _, c := range p.chains {
				for _, r := range c.rules {
					ln(r)
				}
			}
		}
	case tableFilter:
		ln("-A " + chainForward + " " + comment("kubernetes forwarding rules") + " -m mark --mark " + masqMark + "/" + masqMark + " -j ACCEPT")
		ln("-A " + chainForward + " " + comment("kubernetes forwarding conntrack rule") + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
		for _, p := range in.ports {
			for _, r := range p.filterServices {
				ln(r)
			}
		}
		for _, p := range in.ports {
			for _, r := range p.filterExternal {
				ln(r)
			}
		}
		for _, p := range in.ports {
			for _, r := range p.filterFirewall {
				ln(r)
			}
		}
	}
	for _, c := range in.remove {
		ln("-X " + c)
	}
	ln("COMMIT")
	return b.Bytes()
}

// staleChains are the chains of saved that look like the backend's
// per-ServicePort chains and that none of ports owns.
func staleChains(saved *savedTable, ports []*portRules) []string {
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
	for _, c := range saved.chains {
		if ownedChain(c) && !owned[c] {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}
