package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/loader"
)

func newProbeCommand() *cobra.Command {
	var output, fallback string
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Report which kernel features kpr's eBPF dataplane can use, and which dataplane --mode auto runs",
		RunE: func(cmd *cobra.Command, _ []string) error {
			report := probeFeatures()
			auto := autoModeOf(report, fallback)
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(probeOutput{Report: report, ModeAuto: auto, TCAttach: tcAttachOf(report)})
			}
			fmt.Fprintf(out, "kernel %s\n\n", report.Kernel)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FEATURE\tSUPPORTED\tWITHOUT IT")
			for _, f := range report.Features {
				fmt.Fprintf(tw, "%s\t%v\t%s\n", f.Name, f.Supported, f.Impact)
			}
			tw.Flush()
			if auto.Error != "" {
				fmt.Fprintf(out, "\nkpr run would refuse to start: %s\n", auto.Error)
			} else {
				fmt.Fprintf(out, "\nkpr run --mode auto would run the %s dataplane: %s.\n", auto.Backend, auto.Reason)
			}
			if auto.Backend != string(backendEBPF) {
				return nil
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
			printTCSummary(out, report)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&fallback, "fallback-mode", defaultFallback, "the --fallback-mode of the `kpr run` to predict")
	return cmd
}

// probeOutput is `kpr probe -o json`: the report's fields, and what
// --mode auto does with them.
type probeOutput struct {
	loader.Report
	ModeAuto autoMode `json:"modeAuto"`
	// TCAttach is how `kpr run --tc-attach auto` attaches the tc programs:
	// tcx, clsact, or empty when it cannot.
	TCAttach string `json:"tcAttach"`
}

// tcAttachOf is what --tc-attach auto picks on the probed kernel.
func tcAttachOf(r loader.Report) string {
	for _, need := range []string{loader.FeatureFibLookup, loader.FeatureRedirect, loader.FeatureRedirectNeigh} {
		if !r.Has(need) {
			return ""
		}
	}
	switch {
	case r.Has(loader.FeatureTCX):
		return loader.TCAttachTCX.String()
	case r.Has(loader.FeatureClsact):
		return loader.TCAttachLegacy.String()
	}
	return ""
}

// printTCSummary says what the tc programs, which serve traffic from other
// machines, can do here.
func printTCSummary(out io.Writer, r loader.Report) {
	mode := tcAttachOf(r)
	if mode == "" {
		fmt.Fprintln(out, "The tc programs cannot run: NodePorts, ExternalIPs and LoadBalancer IPs are not served to other machines.")
		return
	}
	fmt.Fprintf(out, "The tc programs attach with %s.\n", mode)
	if r.Has(loader.FeatureFibLookupSrc) {
		fmt.Fprintln(out, "Flows to a backend on another node are SNATed to this node's address.")
	} else {
		fmt.Fprintln(out, "Flows to a backend on another node are not SNATed (needs Linux 6.7+).")
	}
}

// autoMode is the backend `kpr run --mode auto` runs on the probed kernel,
// and why (Cause is the reason label of kpr_proxy_mode), or why it
// refuses to start.
type autoMode struct {
	Backend string `json:"backend,omitempty"`
	Cause   string `json:"cause,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Error   string `json:"error,omitempty"`
}

// autoModeOf asks chooseDataplane, so that probe and run cannot disagree.
func autoModeOf(report loader.Report, fallback string) autoMode {
	c, err := chooseDataplane(modeAuto, fallback, report)
	if err != nil {
		return autoMode{Error: err.Error()}
	}
	return autoMode{Backend: string(c.backend), Cause: c.cause, Reason: c.reason}
}
