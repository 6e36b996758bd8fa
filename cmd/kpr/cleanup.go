package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/loader"
)

func newCleanupCommand(g *globalFlags) *cobra.Command {
	var cgroupRoot string
	var devices []string
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach kpr's programs and remove its pinned maps and links",
		Long: "cleanup removes the dataplane that `kpr run` leaves in place on exit, " +
			"and detaches any kpr program still linked to --cgroup-root. Sockets stop being translated at once.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loader.Cleanup(g.bpfRoot); err != nil {
				return fmt.Errorf("cleanup of %s: %w", g.bpfRoot, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed kpr dataplane pinned under %s\n", g.bpfRoot)
			// The tcx links went with the pins; clsact filters are found
			// on the devices themselves.
			if len(devices) > 0 {
				if err := loader.CleanupTC(g.bpfRoot, devices); err != nil {
					return fmt.Errorf("remove kpr's tc programs from %s: %w", strings.Join(devices, ","), err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed kpr's tc programs from %s\n", strings.Join(devices, ","))
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
			n, err := loader.DetachCgroup(cgroupRoot)
			if n > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "detached %d unpinned kpr programs from %s\n", n, cgroupRoot)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&cgroupRoot, "cgroup-root", "", "cgroup v2 directory the programs were attached to (default: the cgroup2 root)")
	cmd.Flags().StringSliceVar(&devices, "devices", nil, "devices kpr run --devices attached the tc programs to: their clsact filters "+
		"(kernels without tcx) are removed with the qdisc kpr added; tcx links go with the pins either way")
	return cmd
}
