package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/loader"
)

func newCleanupCommand(g *globalFlags) *cobra.Command {
	var cgroupRoot string
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
	return cmd
}
