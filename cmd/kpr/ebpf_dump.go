package main

import (
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
)

func newDumpCommand(g *globalFlags) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "dump",
		Short: "List the Services and backends in kpr's pinned BPF maps",
		Long:  "List the Services and backends in kpr's pinned BPF maps." + exitCodesHelp("the maps were read", exitNeedsRoot),
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := openPinnedMaps("dump", g.bpfRoot)
			if err != nil {
				return err
			}
			defer m.Close()
			lb, err := maps.OpenReadOnly(m)
			if err != nil {
				return err
			}
			tables, err := maglevTables(lb, m.KprMaglev)
			if err != nil {
				return err
			}
			svcs := lb.List()
			return output.print(cmd.OutOrStdout(), dumpServices(svcs, tables), func(w io.Writer) error {
				if err := writeDumpTable(w, svcs); err != nil {
					return err
				}
				return writeMaglevTable(w, tables, svcs)
			})
		},
	}
	output = addOutputFlag(cmd.Flags(), "table")
	addDumpConntrack(cmd, g, output)
	return cmd
}

// openPinnedMaps opens the maps pinned under bpfRoot for `kpr command`,
// which says it needs root where the process may not read them.
func openPinnedMaps(command, bpfRoot string) (*bpf.KprMaps, error) {
	m, err := loader.OpenPinnedMaps(bpfRoot)
	return m, asNeedsRoot(err, hasPrivilege(), command, "read the pinned maps under "+bpfRoot)
}

// dumpService is the JSON form of one frontend and scope.
type dumpService struct {
	Frontend        string   `json:"frontend"`
	Protocol        string   `json:"protocol"`
	Scope           string   `json:"scope"`
	Kind            string   `json:"kind"`
	AffinityTimeout uint32   `json:"affinityTimeoutSeconds,omitempty"`
	Backends        []string `json:"backends"`
	// Maglev is the frontend's Maglev table (dump_maglev.go), if any.
	Maglev *dumpMaglev `json:"maglev,omitempty"`
}

// dumpServices is `kpr dump -o json`.
func dumpServices(svcs []maps.Service, tables map[maps.VIPKey]maps.MaglevTable) []dumpService {
	out := make([]dumpService, 0, len(svcs))
	for _, s := range svcs {
		d := dumpService{
			Frontend: frontendAddr(s), Protocol: s.Proto.String(), Scope: s.Scope.String(),
			Kind: s.Kind.String(), AffinityTimeout: s.AffinityTimeout, Backends: []string{},
			Maglev: maglevJSON(tables, s.VIPKey),
		}
		for _, b := range s.Backends {
			d.Backends = append(d.Backends, b.String())
		}
		out = append(out, d)
	}
	return out
}

// writeDumpTable prints one line per backend, like `cilium bpf lb list`.
func writeDumpTable(w io.Writer, svcs []maps.Service) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE ADDRESS\tPROTO\tSCOPE\tKIND\tAFFINITY\tBACKEND ADDRESS (SLOT)")
	for _, s := range svcs {
		affinity := "-"
		if s.AffinityTimeout > 0 {
			affinity = fmt.Sprintf("%ds", s.AffinityTimeout)
		}
		prefix := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", frontendAddr(s), s.Proto, s.Scope, s.Kind, affinity)
		if len(s.Backends) == 0 {
			fmt.Fprintf(tw, "%s\t(no backends: connects are refused)\n", prefix)
			continue
		}
		for i, b := range s.Backends {
			fmt.Fprintf(tw, "%s\t%s (%d)\n", prefix, b, i+1)
			prefix = "\t\t\t\t"
		}
	}
	return tw.Flush()
}

func frontendAddr(s maps.Service) string {
	return netip.AddrPortFrom(s.Addr, s.Port).String()
}
