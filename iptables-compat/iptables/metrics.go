package iptables

import (
	"bytes"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// reportRules tells Options.Metrics, after a successful write, how many
// rules kpr owns in each table of each family (kube-proxy's
// sync_proxy_rules_iptables_total) and how many of them the write wrote
// (sync_proxy_rules_iptables_last). Base jumps into the built-in chains
// are not counted, as kube-proxy counts only the rules of its own chains.
func (p *Plane) reportRules(writes []tableWrite) {
	if p.metrics == nil {
		return
	}
	for _, fam := range p.families {
		for _, table := range tables {
			written := 0
			for _, w := range writes {
				if w.fam == fam && w.table == table {
					for _, part := range w.parts {
						written += appendedRules(part)
					}
				}
			}
			p.metrics.TableRules(fam, table, p.ownedRules(fam, table), written)
		}
	}
}

// ownedRules counts the rules of the Plane's chains in one table of fam
// as p.rendered holds them: the shared chains' fixed rules and every
// ServicePort's lines in them, and, in nat, each ServicePort's own chains.
func (p *Plane) ownedRules(fam netfilter.Family, table string) int {
	n := 0
	for _, c := range sharedChainsOf(table, fam, p.cfg) {
		if c.head != nil {
			n += len(c.head(fam, p.cfg))
		}
		if c.tail != nil {
			n += len(c.tail(fam, p.cfg))
		}
		if c.lines == nil {
			continue
		}
		for _, r := range p.rendered {
			n += len(linesOf(c, r.rulesOf(fam)))
		}
	}
	if table == tableNAT {
		for _, r := range p.rendered {
			if rules := r.rulesOf(fam); rules != nil {
				for _, c := range rules.chains {
					n += len(c.rules)
				}
			}
		}
	}
	return n
}

// appendedRules counts the rules ("-A" lines) of one restore input.
func appendedRules(input []byte) int {
	n := bytes.Count(input, []byte("\n-A "))
	if bytes.HasPrefix(input, []byte("-A ")) {
		n++
	}
	return n
}

// reportRestoreFailure counts one failed iptables-restore run.
func (p *Plane) reportRestoreFailure(fam netfilter.Family) {
	if p.metrics != nil {
		p.metrics.RestoreFailed(fam)
	}
}
