package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
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
				return writeJSON(out, probeOutput{kernelReport: report, ModeAuto: auto, TCAttach: tcAttachOf(report)})
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
			if m := modeOf(backend(auto.Backend)); m != nil && m.probeNotes != nil {
				m.probeNotes(out, report)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&fallback, "fallback-mode", defaultFallback, "the --fallback-mode of the \"kpr run\" to predict")
	return cmd
}

// probeOutput is `kpr probe -o json`: the report's fields, and what
// --mode auto does with them.
type probeOutput struct {
	kernelReport
	ModeAuto autoMode `json:"modeAuto"`
	// TCAttach is how `kpr run --tc-attach auto` attaches the tc programs:
	// tcx, clsact, or empty when it cannot.
	TCAttach string `json:"tcAttach"`
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
func autoModeOf(report kernelReport, fallback string) autoMode {
	c, err := chooseDataplane(modeAuto, fallback, report)
	if err != nil {
		return autoMode{Error: err.Error()}
	}
	return autoMode{Backend: string(c.backend), Cause: c.cause, Reason: c.reason}
}
