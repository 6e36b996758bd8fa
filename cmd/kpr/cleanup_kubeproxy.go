package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/kpr-io/kpr/iptables-compat/kubeproxy"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/netnsexec"
)

// cleanupKubeProxy is `kpr cleanup --kube-proxy`: it removes what upstream
// kube-proxy left in the node's network namespace and nothing of kpr's
// eBPF dataplane, so it runs while kpr serves the node (the last step of
// the migration in docs/migration.md).
func cleanupKubeProxy(out io.Writer, hostNetNS string) error {
	node := kubeproxy.Node{
		Runner: netfilter.RunnerIn(context.Background(), hostNetNS),
		Do: func(fn func() error) error {
			if hostNetNS == "" {
				return fn()
			}
			return netnsexec.InPath(hostNetNS, fn)
		},
	}
	rep, err := kubeproxy.Cleanup(node)
	removed := kubeProxyRemovals(rep)
	for _, line := range removed {
		fmt.Fprintln(out, line)
	}
	if !rep.IPVSFlushed && rep.IPVSNote != "" {
		fmt.Fprintf(out, "IPVS: nothing to do (%s)\n", rep.IPVSNote)
	}
	if err != nil {
		return asNeedsRoot(fmt.Errorf("kube-proxy cleanup incomplete (run it again once the cause is fixed): %w", err),
			hasPrivilege(), "cleanup --kube-proxy", "remove kube-proxy's state in "+netnsName(hostNetNS))
	}
	if len(removed) == 0 {
		fmt.Fprintf(out, "nothing of kube-proxy's to remove in %s\n", netnsName(hostNetNS))
	}
	return nil
}

// kubeProxyRemovals are `kpr cleanup --kube-proxy`'s lines for what
// rep says went.
func kubeProxyRemovals(rep kubeproxy.Report) []string {
	var lines []string
	if rep.Chains > 0 {
		lines = append(lines, fmt.Sprintf("removed %d kube-proxy iptables chains", rep.Chains))
	}
	if len(rep.NFTTables) > 0 {
		lines = append(lines, fmt.Sprintf("removed the nftables tables %s; the table %s (nat chains and a masquerade rule that matches nothing) "+
			"keeps the connections kube-proxy NATed working, until `kpr cleanup`", strings.Join(rep.NFTTables, ", "), kubeproxy.KeepNATTable))
	}
	if rep.IPVSFlushed {
		lines = append(lines, "flushed the IPVS virtual servers")
	}
	if rep.DummyRemoved {
		lines = append(lines, "removed the kube-ipvs0 interface")
	}
	if len(rep.IPSets) > 0 {
		lines = append(lines, "destroyed the ipsets "+strings.Join(rep.IPSets, ", "))
	}
	return lines
}

// removeKeepNAT is the part of a plain `kpr cleanup` (kpr's uninstall or
// rollback) that removes the table `--kube-proxy` added to keep nf_nat
// attached; by then kube-proxy's own nat chains are back, or kpr is simply
// leaving a node it migrated long ago. A failure is reported, not fatal:
// the table translates nothing, and the rest of kpr's dataplane must still
// go.
func removeKeepNAT(removed func(line string), warnings io.Writer, hostNetNS string) {
	tables, err := kubeproxy.RemoveKeepNAT(netfilter.RunnerIn(context.Background(), hostNetNS))
	if len(tables) > 0 {
		removed("removed the nftables tables " + strings.Join(tables, ", "))
	}
	if err != nil {
		fmt.Fprintf(warnings, "warning: could not remove kpr's %s nftables table (nft delete table ip %s): %v\n",
			kubeproxy.KeepNATTable, kubeproxy.KeepNATTable, err)
	}
}
