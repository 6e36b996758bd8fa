package nftables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Inspector is the nftables mode's dataplane.Inspector: one reading of
// kpr's table, which the nftables mode recorded writing.
type Inspector struct {
	cfg      config
	families []netfilter.Family
	present  tableObjects
	// elements are each map's elements, key (joined " . ") to verdict.
	elements map[string]map[string]string
}

var _ dataplane.Inspector = (*Inspector)(nil)

// OpenInspector reads kpr's table in the network namespace at netnsPath
// if the nftables mode recorded writing it; the error wraps
// leftovers.ErrNotRecorded if it did not. masq is the daemon's
// --masquerade-all and --cluster-cidr, which its rules follow.
func OpenInspector(bpfRoot, netnsPath string, masq netfilter.Masquerade) (*Inspector, error) {
	if err := leftovers.Check(bpfRoot, netnsPath, recordMode); err != nil {
		return nil, err
	}
	nft, err := Open(netnsPath)
	if err != nil {
		return nil, err
	}
	return ReadInspector(nft, masq)
}

// ReadInspector reads kpr's table through nft.
func ReadInspector(nft knftables.Interface, masq netfilter.Masquerade) (*Inspector, error) {
	ctx := context.Background()
	in := &Inspector{cfg: config{masq: masq}, families: []netfilter.Family{netfilter.IPv4, netfilter.IPv6}, elements: map[string]map[string]string{}}
	var err error
	if in.present, err = listTable(ctx, nft); err != nil {
		return nil, err
	}
	for _, m := range in.present.maps {
		els, err := nft.ListElements(ctx, "map", m)
		if err != nil {
			return nil, fmt.Errorf("list the elements of map %s: %w", m, err)
		}
		in.elements[m] = map[string]string{}
		for _, e := range els {
			in.elements[m][normalKey(e.Key)] = strings.Join(e.Value, " ")
		}
	}
	return in, nil
}

// FrontendElements is what kpr's table holds for one frontend: the
// verdict of each map that has it.
type FrontendElements struct {
	Frontend string `json:"frontend"`
	// Verdicts maps a map's name to the frontend's element there.
	Verdicts map[string]string `json:"verdicts"`
}

func (f FrontendElements) Columns() []string {
	var vs []string
	for _, m := range slices.Sorted(maps.Keys(f.Verdicts)) {
		vs = append(vs, m+": "+f.Verdicts[m])
	}
	if len(vs) == 0 {
		vs = []string{"(in no map: not served)"}
	}
	return []string{f.Frontend, strings.Join(vs, "; ")}
}

// InspectPorts reports the map elements of each frontend of ports and
// every element and chain kpr writes for them that the table lacks or
// holds otherwise. The rules inside the chains are not compared: nft
// does not list them back as kpr writes them.
func (in *Inspector) InspectPorts(ports []dataplane.ServicePort) (dataplane.Inspection, error) {
	out := dataplane.Inspection{Key: "elements", Title: "nftables map elements", Header: []string{"FRONTEND", "ELEMENTS"},
		Agrees: "the table inet kpr holds the map elements and chains kpr writes for these Services"}
	for i := range ports {
		sp := &ports[i]
		for _, fam := range in.families {
			want := renderPort(sp, fam, in.cfg)
			for _, fe := range sp.Frontends {
				if netfilter.FamilyOf(fe.Addr) != fam || !servable(fe) {
					continue
				}
				row := FrontendElements{Frontend: fe.AddrPort().String() + "/" + fe.Protocol.String(), Verdicts: map[string]string{}}
				key := normalKey([]string{fe.Addr.Unmap().String(), netfilter.ProtoName(fe.Protocol), strconv.Itoa(int(fe.Port))})
				for _, base := range []string{mapServiceIPs, mapNoEndpoints, mapNoLocalEndpoints, mapFirewallIPs} {
					m := mapOf(base, fam)
					if v, ok := in.elements[m][key]; ok {
						row.Verdicts[m] = v
					}
				}
				out.Rows = append(out.Rows, row)
			}
			for _, e := range want.elements {
				got, ok := in.elements[e.m][normalKey(e.key)]
				switch {
				case !ok:
					out.Divergences = append(out.Divergences, fmt.Sprintf("map %s lacks %s : %s", e.m, normalKey(e.key), e.value))
				case got != e.value:
					out.Divergences = append(out.Divergences, fmt.Sprintf("map %s holds %s : %s, kpr writes %s", e.m, normalKey(e.key), got, e.value))
				}
			}
			for _, c := range want.chains {
				if !slices.Contains(in.present.chains, c.name) {
					out.Divergences = append(out.Divergences, "chain "+c.name+" is missing")
				}
			}
		}
	}
	return out, nil
}

// TableFill is one kind of object of kpr's table and how many it holds.
type TableFill struct {
	Object string `json:"object"`
	Count  int    `json:"count"`
}

func (t TableFill) Columns() []string { return []string{t.Object, strconv.Itoa(t.Count)} }

// InspectNode reports how many chains, sets and map elements kpr's table
// holds.
func (in *Inspector) InspectNode() []dataplane.Inspection {
	out := dataplane.Inspection{Key: "nftables", Title: "nftables table " + string(Family) + " " + TableName, Header: []string{"OBJECT", "COUNT"},
		None: "no table"}
	if len(in.present.chains) > 0 {
		out.Rows = append(out.Rows, TableFill{"chains", len(in.present.chains)}, TableFill{"sets", len(in.present.sets)})
		for _, m := range slices.Sorted(maps.Keys(in.elements)) {
			out.Rows = append(out.Rows, TableFill{"map " + m, len(in.elements[m])})
		}
	}
	return []dataplane.Inspection{out}
}

// Close releases nothing: the reading holds no handle.
func (in *Inspector) Close() {}
