package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/maps"
)

// addDumpConntrack gives `kpr dump` its --conntrack flag, which lists the
// tc programs' flows instead of the Services, in the dump's --output.
func addDumpConntrack(cmd *cobra.Command, g *globalFlags, output *outputFormat) {
	var conntrack bool
	cmd.Flags().BoolVar(&conntrack, "conntrack", false, "list the flows from other machines the tc programs translate (their conntrack entries) instead of the Services")
	services := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if !conntrack {
			return services(cmd, args)
		}
		m, err := openPinnedMaps("dump", g.bpfRoot)
		if err != nil {
			return err
		}
		defer m.Close()
		flows, err := maps.ConntrackFlows(m.KprConntrack, m.KprCtNew)
		if err != nil {
			return err
		}
		sortFlows(flows)
		return output.print(cmd.OutOrStdout(), dumpFlows(flows), func(w io.Writer) error { return writeConntrackTable(w, flows) })
	}
}

// sortFlows orders flows by frontend, then client, so that one Service's
// flows are listed together.
func sortFlows(flows []maps.ConntrackFlow) {
	slices.SortFunc(flows, func(a, b maps.ConntrackFlow) int {
		if c := a.Frontend.Compare(b.Frontend); c != 0 {
			return c
		}
		if c := int(a.Proto) - int(b.Proto); c != 0 {
			return c
		}
		return a.Client.Compare(b.Client)
	})
}

// flowState names what a flow has shown, as conntrack(8) would. A TCP flow
// is "replied" from the backend's SYN-ACK (netfilter's SYN_RECV) until its
// handshake has completed both ways, and "established" after that
// (docs/tc-dataplane.md, Conntrack).
func flowState(f maps.ConntrackFlow) string {
	switch {
	case f.ExpiresIn < 0:
		return "expired"
	case f.Rst:
		return "reset"
	case f.Fin:
		return "closing"
	case f.Established:
		return "established"
	case f.Replied:
		return "replied"
	}
	return "unreplied"
}

// dumpFlow is the JSON form of one flow.
type dumpFlow struct {
	Protocol string `json:"protocol"`
	Client   string `json:"client"`
	Frontend string `json:"frontend"`
	Backend  string `json:"backend"`
	// SNAT is the node address and port the flow leaves from toward a
	// backend on another node; absent when it is not SNATed.
	SNAT  string `json:"snat,omitempty"`
	State string `json:"state"`
	// ExpiresInSeconds is how long the flow lives without another
	// packet; negative once it is over.
	ExpiresInSeconds float64 `json:"expiresInSeconds"`
}

// dumpFlows is `kpr dump --conntrack -o json`.
func dumpFlows(flows []maps.ConntrackFlow) []dumpFlow {
	out := make([]dumpFlow, 0, len(flows))
	for _, f := range flows {
		d := dumpFlow{Protocol: f.Proto.String(), Client: f.Client.String(), Frontend: f.Frontend.String(),
			Backend: f.Backend.String(), State: flowState(f), ExpiresInSeconds: f.ExpiresIn.Seconds()}
		if f.SNAT.IsValid() {
			d.SNAT = f.SNAT.String()
		}
		out = append(out, d)
	}
	return out
}

func writeConntrackTable(w io.Writer, flows []maps.ConntrackFlow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tCLIENT\tFRONTEND\tBACKEND\tSNAT\tSTATE\tEXPIRES IN")
	for _, f := range flows {
		snat := "-"
		if f.SNAT.IsValid() {
			snat = f.SNAT.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Proto, f.Client, f.Frontend, f.Backend, snat, flowState(f), expiresIn(f.ExpiresIn))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(flows) == 0 {
		_, err := fmt.Fprintln(w, "(no flows: the tc programs translate none right now)")
		return err
	}
	return nil
}

// expiresIn rounds to the second, which is the entries' resolution that
// matters to a reader.
func expiresIn(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return d.Round(time.Second).String()
}
