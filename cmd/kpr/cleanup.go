package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

func newCleanupCommand(g *globalFlags) *cobra.Command {
	// The settings of `kpr run` that say where the dataplane is.
	var run runFlags
	var kubeProxy bool
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove the dataplane of every mode: kpr's programs, pinned maps and links, its iptables chains and its IPVS state",
		Long: "cleanup removes the dataplane that `kpr run` leaves in place on exit, whichever mode wrote it: " +
			"the pinned programs, maps and links of the eBPF mode, any kpr program still linked to --cgroup-root, " +
			"and what kpr's netfilter modes recorded writing in the node's network namespace (--host-netns): the iptables mode's " +
			"KUBE-* chains, the IPVS mode's virtual servers, dummy interface, ipsets and chains. Services stop being translated at once. " +
			"It prints a line for each kind of state it removed, or says there was nothing to remove." +
			exitCodesHelp("everything found was removed, or there was nothing to remove", exitNeedsRoot),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if kubeProxy {
				return cleanupKubeProxy(out, run.hostNetNS)
			}
			return cleanupKpr(out, g, run)
		},
	}
	cmd.Flags().BoolVar(&kubeProxy, "kube-proxy", false, "remove upstream kube-proxy's leftovers instead of kpr's dataplane: its iptables chains "+
		"(also kpr's iptables-mode ones, which have the same names), its nftables tables and its IPVS state; see docs/migration.md")
	cmd.Flags().StringVar(&run.hostNetNS, "host-netns", "", "network namespace file of the node whose iptables chains and tc filters to remove, as given to \"kpr run\"; empty means kpr's own")
	for _, m := range modes {
		if m.addCleanupFlags != nil {
			m.addCleanupFlags(cmd.Flags(), &run)
		}
	}
	return cmd
}

// cleanupKpr removes what every mode of kpr left on the node that run
// describes, and says what went, or that nothing was there: a script (or
// an operator) that ran it on the wrong --bpf-root or --host-netns learns
// it from the output.
func cleanupKpr(out io.Writer, g *globalFlags, run runFlags) error {
	at := dataplaneAt{bpfRoot: g.bpfRoot, run: run}
	removed := 0
	line := func(l string) {
		removed++
		fmt.Fprintln(out, l)
	}
	err := removeKpr(line, out, at)
	if err == nil && removed == 0 {
		fmt.Fprintf(out, "nothing to remove: kpr left no state under %s, on the devices, on the cgroup or in the netfilter tables of %s\n",
			at.bpfRoot, netnsName(run.hostNetNS))
	}
	return asNeedsRoot(err, hasPrivilege(), "cleanup", "remove kpr's state under "+at.bpfRoot+" and in "+netnsName(run.hostNetNS))
}

// removeKpr is cleanupKpr's work: each removal is a line on removed,
// warnings go to out.
func removeKpr(removed func(line string), out io.Writer, at dataplaneAt) error {
	if err := removeEveryModeState(removed, at); err != nil {
		return err
	}
	removeKeepNAT(removed, out, at.run.hostNetNS)
	return sweepEveryMode(removed, at)
}

// netnsName names the network namespace of --host-netns for a message.
func netnsName(hostNetNS string) string {
	if hostNetNS == "" {
		return "this network namespace"
	}
	return "the network namespace " + hostNetNS
}

// cleanupAsKubeProxy is kube-proxy's --cleanup: every proxy mode's state
// goes, kpr's (all its modes) and upstream kube-proxy's alike, so that a
// node prepared with `kube-proxy --cleanup` is prepared the same way by kpr.
func cleanupAsKubeProxy(out io.Writer, g *globalFlags, run runFlags) error {
	if err := cleanupKpr(out, g, run); err != nil {
		return err
	}
	return cleanupKubeProxy(out, run.hostNetNS)
}
