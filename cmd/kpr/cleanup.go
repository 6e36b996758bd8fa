package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/netnsexec"
)

func newCleanupCommand(g *globalFlags) *cobra.Command {
	var cgroupRoot, hostNetNS string
	var devices []string
	var kubeProxy bool
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove the dataplane of every mode: kpr's programs, pinned maps and links, its iptables chains and its IPVS state",
		Long: "cleanup removes the dataplane that `kpr run` leaves in place on exit, whichever mode wrote it: " +
			"the pinned programs, maps and links of the eBPF mode, any kpr program still linked to --cgroup-root, " +
			"and what kpr's netfilter modes recorded writing in the node's network namespace (--host-netns): the iptables mode's " +
			"KUBE-* chains, the IPVS mode's virtual servers, dummy interface, ipsets and chains. Services stop being translated at once.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if kubeProxy {
				return cleanupKubeProxy(out, hostNetNS)
			}
			if err := removeEveryModeState(func(l string) { fmt.Fprintln(out, l) }, g.bpfRoot, hostNetNS); err != nil {
				return err
			}
			removeKeepNAT(out, hostNetNS)
			// The tcx links went with the pins; clsact filters are found
			// on the devices themselves: the named ones, or every device
			// of the node, since kpr run may have picked them itself.
			// Only kpr's own filters (and a qdisc left empty by them) go.
			where := "every device"
			if len(devices) > 0 {
				where = strings.Join(devices, ",")
			}
			removeTC := func() error { return loader.CleanupTC(g.bpfRoot, devices) }
			var err error
			if hostNetNS != "" {
				err = netnsexec.InPath(hostNetNS, removeTC)
			} else {
				err = removeTC()
			}
			if err != nil {
				return fmt.Errorf("remove kpr's tc programs from %s: %w", where, err)
			}
			// Programs whose pins were lost still translate: find them
			// through the cgroup itself.
			if cgroupRoot == "" {
				root, err := loader.FindCgroup2Mount()
				if err != nil || root == "" {
					return err
				}
				cgroupRoot = root
			}
			detached, err := loader.DetachCgroup(cgroupRoot)
			if detached > 0 {
				fmt.Fprintf(out, "detached %d unpinned kpr programs from %s\n", detached, cgroupRoot)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&cgroupRoot, "cgroup-root", "", "cgroup v2 directory the programs were attached to (default: the cgroup2 root)")
	cmd.Flags().StringSliceVar(&devices, "devices", nil, "devices to remove kpr's clsact tc filters (kernels without tcx) from, with the qdisc kpr added; "+
		"empty means every device of --host-netns; tcx links go with the pins either way")
	cmd.Flags().BoolVar(&kubeProxy, "kube-proxy", false, "remove upstream kube-proxy's leftovers instead of kpr's dataplane: its iptables chains "+
		"(also kpr's iptables-mode ones, which have the same names), its nftables tables and its IPVS state; see docs/migration.md")
	cmd.Flags().StringVar(&hostNetNS, "host-netns", "", "network namespace file of the node whose iptables chains and tc filters to remove, as given to `kpr run`; empty means kpr's own")
	return cmd
}
