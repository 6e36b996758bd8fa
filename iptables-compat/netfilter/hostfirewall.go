package netfilter

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// The host firewall, as the eBPF mode's tc programs see it: they translate
// traffic to NodePorts and LoadBalancer IPs before netfilter, and send a
// flow to a backend on another node out with a redirect, so the rules an
// operator wrote in INPUT, FORWARD or an nftables base chain at those hooks
// never see it (docs/operations.md, "Host firewalls"). ReadHostFirewall
// counts those rules, read only, so that `kpr status` can say so.

// HostFirewall counts the node's netfilter rules that the tc programs'
// traffic bypasses: rules of other tools than kpr and kube-proxy.
type HostFirewall struct {
	// IPTables counts the rules in the filter table's INPUT and FORWARD
	// chains, of both variants and families, that are not jumps to
	// kube-proxy's or kpr's own chains; a chain whose policy is not
	// ACCEPT counts as one rule.
	IPTables int `json:"iptables"`
	// NFTables counts the rules (and non-accept policies) of nftables base
	// chains at the prerouting, input and forward hooks, of tables that
	// are neither iptables-nft's (counted above) nor kube-proxy's.
	NFTables int `json:"nftables"`
	// Errors say which tool could not be read; the counts leave it out.
	Errors []string `json:"errors,omitempty"`
}

// Total is every rule counted.
func (f HostFirewall) Total() int { return f.IPTables + f.NFTables }

// ownChain reports whether chain is kube-proxy's (and kubelet's KUBE-
// chains) or kpr's: their jumps from INPUT and FORWARD serve Services,
// and restrict nothing an operator wrote.
func ownChain(chain string) bool {
	return strings.HasPrefix(chain, "KUBE-") || strings.HasPrefix(chain, "KPR-")
}

// CountFilterRules counts the rules of iptables-save output's filter table
// that the tc programs bypass: those in INPUT and FORWARD that do not jump
// to an own chain, and a policy other than ACCEPT of either chain.
func CountFilterRules(save []byte) (int, error) {
	tables, err := ParseSave(save)
	if err != nil {
		return 0, err
	}
	filter := tables["filter"]
	if filter == nil {
		return 0, nil
	}
	n := 0
	for _, chain := range []string{"INPUT", "FORWARD"} {
		if p := filter.policies[chain]; p != "" && p != "ACCEPT" {
			n++
		}
		for _, r := range filter.ChainRules(chain) {
			if !ownChain(RuleArg(r, "-j")) && !ownChain(RuleArg(r, "-g")) {
				n++
			}
		}
	}
	return n, nil
}

// iptablesNFTTables are the tables iptables-nft makes in nftables; their
// rules are counted from iptables-nft-save, in its own terms.
var iptablesNFTTables = []string{"filter", "nat", "mangle", "raw", "security"}

// bypassedHooks are the nftables hooks the tc programs' translated traffic
// never reaches, or reaches already translated.
var bypassedHooks = []string{"prerouting", "input", "forward"}

// CountNFTRules counts, in `nft -j list ruleset` output, the rules of base
// chains at bypassedHooks, and a drop policy of such a chain as one rule;
// iptables-nft's tables and kube-proxy's nftables mode's table are left
// out.
func CountNFTRules(ruleset []byte) (int, error) {
	var doc struct {
		NFTables []struct {
			Chain *struct {
				Family, Table, Name, Hook, Policy string
			} `json:"chain"`
			Rule *struct {
				Family, Table, Chain string
			} `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(ruleset, &doc); err != nil {
		return 0, fmt.Errorf("read nft -j list ruleset: %w", err)
	}
	type chainID struct{ family, table, name string }
	foreign := func(family, table string) bool {
		if table == "kube-proxy" {
			return false
		}
		return !((family == "ip" || family == "ip6") && slices.Contains(iptablesNFTTables, table))
	}
	counted := map[chainID]bool{}
	n := 0
	for _, o := range doc.NFTables {
		if c := o.Chain; c != nil && slices.Contains(bypassedHooks, c.Hook) && foreign(c.Family, c.Table) {
			counted[chainID{c.Family, c.Table, c.Name}] = true
			if c.Policy == "drop" {
				n++
			}
		}
	}
	for _, o := range doc.NFTables {
		if r := o.Rule; r != nil && counted[chainID{r.Family, r.Table, r.Chain}] {
			n++
		}
	}
	return n, nil
}

// ReadHostFirewall counts the rules of the network namespace r runs in
// that the tc programs bypass. It only reads: iptables-save without -t,
// which lists the tables that exist and loads no module, for both
// variants and families, and `nft -j list ruleset` where nft runs. A tool
// that is not installed counts nothing; one that fails otherwise is named
// in Errors.
func ReadHostFirewall(r Runner) HostFirewall {
	var fw HostFirewall
	for _, v := range Variants {
		for _, fam := range Families {
			save := ToolsFor(v, fam).Save
			out, err := r.Run(save, nil, nil)
			if err != nil {
				if !notInstalled(err) {
					fw.Errors = append(fw.Errors, err.Error())
				}
				continue
			}
			n, err := CountFilterRules(out)
			if err != nil {
				fw.Errors = append(fw.Errors, fmt.Sprintf("%s: %v", save, err))
				continue
			}
			fw.IPTables += n
		}
	}
	out, err := r.Run("nft", []string{"-j", "list", "ruleset"}, nil)
	switch {
	case err != nil && !notInstalled(err):
		fw.Errors = append(fw.Errors, err.Error())
	case err == nil:
		n, err := CountNFTRules(out)
		if err != nil {
			fw.Errors = append(fw.Errors, err.Error())
		}
		fw.NFTables = n
	}
	return fw
}

// notInstalled reports whether err says the binary is not on the PATH.
func notInstalled(err error) bool { return errors.Is(err, exec.ErrNotFound) }
