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
	fmt.Fprintf(out, "removed %d kube-proxy iptables chains\n", rep.Chains)
	if len(rep.NFTTables) > 0 {
		fmt.Fprintf(out, "removed the nftables tables %s; the table %s (nat chains and a masquerade rule that matches nothing) keeps the connections kube-proxy NATed working, "+
			"until `kpr cleanup`\n", strings.Join(rep.NFTTables, ", "), kubeproxy.KeepNATTable)
	}
	switch {
	case rep.IPVSFlushed:
		fmt.Fprintln(out, "flushed the IPVS virtual servers")
	case rep.IPVSNote != "":
		fmt.Fprintf(out, "IPVS: nothing to do (%s)\n", rep.IPVSNote)
	}
	if rep.DummyRemoved {
		fmt.Fprintln(out, "removed the kube-ipvs0 interface")
	}
	if len(rep.IPSets) > 0 {
		fmt.Fprintf(out, "destroyed the ipsets %s\n", strings.Join(rep.IPSets, ", "))
	}
	if err != nil {
		return fmt.Errorf("kube-proxy cleanup incomplete (run it again once the cause is fixed): %w", err)
	}
	return nil
}

// removeKeepNAT is the part of a plain `kpr cleanup` (kpr's uninstall or
// rollback) that removes the table `--kube-proxy` added to keep nf_nat
// attached; by then kube-proxy's own nat chains are back, or kpr is simply
// leaving a node it migrated long ago. A failure is reported, not fatal:
// the table translates nothing, and the rest of kpr's dataplane must still
// go.
func removeKeepNAT(out io.Writer, hostNetNS string) {
	removed, err := kubeproxy.RemoveKeepNAT(netfilter.RunnerIn(context.Background(), hostNetNS))
	if len(removed) > 0 {
		fmt.Fprintf(out, "removed the nftables tables %s\n", strings.Join(removed, ", "))
	}
	if err != nil {
		fmt.Fprintf(out, "warning: could not remove kpr's %s nftables table (nft delete table ip %s): %v\n",
			kubeproxy.KeepNATTable, kubeproxy.KeepNATTable, err)
	}
}
