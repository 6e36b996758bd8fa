package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/loader"
)

func newProbeCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Report which kernel features kpr's eBPF dataplane can use",
		RunE: func(cmd *cobra.Command, _ []string) error {
			report := loader.Probe()
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(report)
			}
			fmt.Fprintf(out, "kernel %s\n\n", report.Kernel)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FEATURE\tSUPPORTED\tWITHOUT IT")
			for _, f := range report.Features {
				fmt.Fprintf(tw, "%s\t%v\t%s\n", f.Name, f.Supported, f.Impact)
			}
			tw.Flush()
			if err := report.RequireSocketLB(); err != nil {
				fmt.Fprintf(out, "\neBPF mode: unavailable: %v\n", err)
			} else {
				fmt.Fprintln(out, "\neBPF mode: available")
			}
			if !report.Has(loader.FeatureSetRetval) {
				fmt.Fprintln(out, "Connects to a Service without endpoints fail with EPERM (no bpf_set_retval).")
			} else {
				fmt.Fprintln(out, "Connects to a Service without endpoints fail with ECONNREFUSED.")
			}
			if report.Has(loader.FeatureUDPSockTerm) {
				fmt.Fprintln(out, "Connected UDP sockets of a removed backend are destroyed, so clients reconnect.")
			} else {
				fmt.Fprintln(out, "Connected UDP sockets of a removed backend keep sending to it (needs Linux 6.5+).")
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}
