package main

import (
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/maps"
)

// The Maglev part of `kpr dump`: for each frontend with a Maglev table
// (kpr run --lb-algorithm maglev), how many of the table's slots each
// backend has, which is the share of new flows from outside it gets.

// maglevTables reads the tables in m (kpr_maglev) by frontend and scope.
func maglevTables(lb *maps.LB, m *ebpf.Map) (map[maps.VIPKey]maps.MaglevTable, error) {
	tables, err := maps.MaglevTables(lb, m)
	if err != nil {
		return nil, err
	}
	out := make(map[maps.VIPKey]maps.MaglevTable, len(tables))
	for _, t := range tables {
		out[t.VIPKey] = t
	}
	return out, nil
}

// dumpMaglev is the JSON form of one frontend's Maglev table.
type dumpMaglev struct {
	TableSize int               `json:"tableSize"`
	Shares    []dumpMaglevShare `json:"shares"`
}

type dumpMaglevShare struct {
	Backend string `json:"backend"`
	Slots   int    `json:"slots"`
}

// maglevJSON is the JSON form of key's table, nil when it has none.
func maglevJSON(tables map[maps.VIPKey]maps.MaglevTable, key maps.VIPKey) *dumpMaglev {
	t, ok := tables[key]
	if !ok {
		return nil
	}
	d := &dumpMaglev{TableSize: t.Size}
	for _, s := range t.Shares {
		d.Shares = append(d.Shares, dumpMaglevShare{Backend: shareBackend(s), Slots: s.Slots})
	}
	return d
}

// writeMaglevTable prints one line per backend of every table, after the
// services; nothing when no frontend has a table.
func writeMaglevTable(w io.Writer, tables map[maps.VIPKey]maps.MaglevTable, svcs []maps.Service) error {
	if len(tables) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MAGLEV TABLE OF\tPROTO\tSCOPE\tTABLE SIZE\tBACKEND ADDRESS\tSLOTS\tSHARE")
	// In the services' order, so the two lists read alike.
	for _, s := range svcs {
		t, ok := tables[s.VIPKey]
		if !ok {
			continue
		}
		prefix := fmt.Sprintf("%s\t%s\t%s\t%d", frontendAddr(s), s.Proto, s.Scope, t.Size)
		for _, share := range t.Shares {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%%\n", prefix, shareBackend(share), share.Slots, 100*float64(share.Slots)/float64(max(t.Size, 1)))
			prefix = "\t\t\t"
		}
	}
	return tw.Flush()
}

// shareBackend names a share's backend; a slot naming a backend id the
// backend map lacks is shown by its id (its flows fall back to a random
// pick).
func shareBackend(s maps.MaglevShare) string {
	if s.Backend == (netip.AddrPort{}) {
		return fmt.Sprintf("(missing backend id %d)", s.ID)
	}
	return s.Backend.String()
}
