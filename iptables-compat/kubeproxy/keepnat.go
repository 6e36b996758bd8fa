package kubeproxy

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Connections kube-proxy NATed keep their translation in their conntrack
// entries, not in the rules: once the rules are gone, the kernel goes on
// rewriting their packets from the entries, as long as nf_nat stays
// attached to the namespace. What keeps it attached was found by test
// (tests/migration, kernel 6.18): deleting kube-proxy's nftables table
// when it holds the namespace's only nat chains and masquerade rule stops
// every established connection it NATed at once (the conntrack entries
// are still listed, but their packets are no longer rewritten: DNATed
// ClusterIP packets go out to the ClusterIP and time out, NodePort ones
// reach the node's own port and are reset or refused). Empty nat chains
// alone do not prevent it; nat chains with a masquerade rule do. The
// iptables mode does not have the problem, since the iptables nat table
// and its built-in chains stay when kube-proxy's chains go. kpr's eBPF
// mode writes no nat rule, and a node's other components may write none.
//
// So before deleting a kube-proxy table, Cleanup adds a table of kpr's
// with a nat chain at each NAT hook and one masquerade rule that matches
// no packet (IP protocol 255 is reserved, RFC 5237): it translates nothing
// new, and keeps the connections that are still open working. It stays
// until `kpr cleanup` (kpr's own uninstall or rollback, when kube-proxy's
// nat chains are back or the connections through kube-proxy are long
// gone) or a reboot.

// KeepNATTable is the name of that table, in the ip and ip6 families.
const KeepNATTable = "kpr-keep-nat"

// keepNATRuleset declares the table. The priorities are the iptables nat
// table's. A second run adds a second masquerade rule, so keepNAT flushes
// the table it declares first.
const keepNATRuleset = `table %[1]s %[2]s {}
flush table %[1]s %[2]s
table %[1]s %[2]s {
	chain prerouting { type nat hook prerouting priority -100; policy accept; }
	chain output { type nat hook output priority -100; policy accept; }
	chain input { type nat hook input priority 100; policy accept; }
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		meta l4proto 255 masquerade comment "matches nothing; keeps established NATed connections working (kpr cleanup --kube-proxy)"
	}
}
`

// keepNAT adds the table in family ("ip" or "ip6").
func keepNAT(r netfilter.Runner, family string) error {
	if _, err := r.Run("nft", []string{"-f", "-"}, fmt.Appendf(nil, keepNATRuleset, family, KeepNATTable)); err != nil {
		return fmt.Errorf("add the %s %s table that keeps established NATed connections working: %w "+
			"(kube-proxy's %s table stays, so the next cleanup tries again)", family, KeepNATTable, err, family)
	}
	return nil
}

// RemoveKeepNAT deletes the tables Cleanup added, and returns which it
// deleted. Connections that kube-proxy NATed and that are still open stop
// working if no other nat chain is left in their family.
func RemoveKeepNAT(r netfilter.Runner) ([]string, error) {
	families, err := familiesWithTable(r, KeepNATTable)
	if err != nil || len(families) == 0 {
		return nil, err
	}
	var deleted []string
	var errs []error
	for _, family := range families {
		if _, err := r.Run("nft", []string{"delete", "table", family, KeepNATTable}, nil); err != nil {
			errs = append(errs, fmt.Errorf("delete the nftables table %s %s: %w", family, KeepNATTable, err))
			continue
		}
		deleted = append(deleted, family+" "+KeepNATTable)
	}
	return deleted, errors.Join(errs...)
}

// familiesWithTable lists the ip and ip6 families that hold an nftables
// table called name. Without an nft binary there is none.
func familiesWithTable(r netfilter.Runner, name string) ([]string, error) {
	out, err := r.Run("nft", []string{"list", "tables"}, nil)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("list the nftables tables (nft list tables): %w", err)
	}
	return tablesNamed(out, name), nil
}

// tablesNamed returns the ip and ip6 families in which `nft list tables`
// output lists a table called name.
func tablesNamed(listing []byte, name string) []string {
	var families []string
	for _, line := range strings.Split(string(listing), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" && f[2] == name && (f[1] == "ip" || f[1] == "ip6") {
			families = append(families, f[1])
		}
	}
	return families
}
