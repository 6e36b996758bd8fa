package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newProbeCommand() *cobra.Command {
	var fallback string
	var output *outputFormat
	short := "Report which kernel features kpr's eBPF dataplane can use, and which dataplane --mode auto runs"
	cmd := &cobra.Command{
		Use:   "probe",
		Short: short,
		Long: short + "." + exitCodesHelp("kpr run --mode auto would start on this node", exitWouldRefuse, exitNeedsRoot) +
			"\n  (6: the kernel refused the probes to a process without privilege, which says nothing of the kernel: nothing is reported)",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			report, err := probeFor("probe", hasPrivilege())
			if err != nil {
				return err
			}
			res := probeOutput{kernelReport: report, ModeAuto: autoModeOf(report, fallback), TCAttach: tcAttachOf(report)}
			if err := output.print(cmd.OutOrStdout(), res, res.write); err != nil {
				return err
			}
			return res.verdict()
		},
	}
	output = addOutputFlag(cmd.Flags(), "table")
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

// write is the table form of the report.
func (res probeOutput) write(out io.Writer) error {
	fmt.Fprintf(out, "kernel %s\n\n", res.Kernel)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tSUPPORTED\tWITHOUT IT")
	for _, f := range res.Features {
		fmt.Fprintf(tw, "%s\t%v\t%s\n", f.Name, f.Supported, f.Impact)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	auto := res.ModeAuto
	if auto.Error != "" {
		_, err := fmt.Fprintf(out, "\nkpr run would refuse to start: %s\n", auto.Error)
		return err
	}
	fmt.Fprintf(out, "\nkpr run --mode auto would run the %s dataplane: %s.\n", auto.Backend, auto.Reason)
	if m := modeOf(backend(auto.Backend)); m != nil && m.probeNotes != nil {
		m.probeNotes(out, res.kernelReport)
	}
	return nil
}

// verdict is probe's exit: exitWouldRefuse where kpr run would refuse to
// start.
func (res probeOutput) verdict() error {
	if res.ModeAuto.Error == "" {
		return nil
	}
	return withExitCode(exitWouldRefuse, errors.New("kpr run would refuse to start: "+res.ModeAuto.Error))
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

// probeFor probes the kernel for `kpr command`. privileged is
// hasPrivilege's answer: without privilege the kernel refuses the probes,
// and the report would list features as missing that the kernel has;
// the error says so instead.
func probeFor(command string, privileged bool) (kernelReport, error) {
	r := probeFeatures()
	return r, probeRefused(r, privileged, command)
}

// probeRefused is probeFor's error for the report r: needsRoot's where the
// kernel refused some probe to a process without privilege. A privileged
// process refused a probe meets a policy (a BPF LSM, seccomp), which
// chooseDataplane reports as such.
func probeRefused(r kernelReport, privileged bool, command string) error {
	denied := r.Denied()
	if privileged || len(denied) == 0 {
		return nil
	}
	return needsRoot(command, "load the test programs and maps that probe the kernel's features",
		fmt.Errorf("the kernel refused %d of %d probes, such as %s: %s", len(denied), len(r.Features), denied[0].Name, denied[0].Error))
}
