package ipvs

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Reading the kernel back for `kpr explain` and `kpr status`: the virtual
// servers, addresses, set members and rules kpr owns, read as a restarted
// Plane reads them, and compared with what desire asks for a ServicePort,
// so the reader holds no second notion of what IPVS should hold.

// Inspector is the IPVS mode's dataplane.Inspector: one reading of the
// network namespace the IPVS mode recorded writing.
type Inspector struct {
	p     *Plane
	cur   *kstate
	saved map[netfilter.Family]map[string]*netfilter.SavedTable
	close func()
}

var _ dataplane.Inspector = (*Inspector)(nil)

// OpenInspector reads the network namespace at netnsPath, whose iptables
// binaries r runs, if the IPVS mode recorded writing it; the error wraps
// leftovers.ErrNotRecorded if it did not. Close releases it.
func OpenInspector(bpfRoot, netnsPath string, r netfilter.Runner) (*Inspector, error) {
	if err := leftovers.Check(bpfRoot, netnsPath, recordMode); err != nil {
		return nil, err
	}
	fams, err := netfilter.NodeFamilies(r, zap.NewNop())
	if err != nil {
		return nil, err
	}
	k, err := NewNetlinkKernel(netnsPath)
	if err != nil {
		return nil, err
	}
	in, err := newInspector(k, r, fams)
	if err != nil {
		k.Close()
		return nil, err
	}
	in.close = k.Close
	return in, nil
}

// newInspector reads what k and r reach, for the families given.
func newInspector(k Kernel, r netfilter.Runner, fams map[netfilter.Family]netfilter.Tools) (*Inspector, error) {
	p, err := New(Options{Kernel: k, Runner: r, Families: fams})
	if err != nil {
		return nil, err
	}
	cur, saved, err := p.read()
	if err != nil {
		return nil, fmt.Errorf("read kpr's IPVS state: %w", err)
	}
	return &Inspector{p: p, cur: cur, saved: saved, close: func() {}}, nil
}

// Close releases the kernel handles.
func (in *Inspector) Close() { in.close() }

// VirtualServer is what IPVS holds for one frontend: its virtual server,
// or the firewall-mark one that serves the node's own traffic to it.
type VirtualServer struct {
	// Frontend is address:port/protocol, with "from this node" for the
	// firewall-mark virtual server.
	Frontend string `json:"frontend"`
	// VirtualServer is the virtual server's key as IPVS has it.
	VirtualServer string `json:"virtualServer"`
	// Want are the real servers kpr writes; Have those IPVS sends new
	// connections to (weight above 0), Draining those of weight 0 that
	// keep their connections until the reaper removes them.
	Want     []string `json:"want"`
	Have     []string `json:"have"`
	Draining []string `json:"draining,omitempty"`
	// PersistenceSeconds is the virtual server's ClientIP affinity
	// timeout, 0 for none.
	PersistenceSeconds uint32 `json:"persistenceSeconds,omitempty"`
	Present            bool   `json:"present"`
	Matches            bool   `json:"matches"`
}

// Columns says whether the virtual server matches.
func (v VirtualServer) Columns() []string {
	state := "matches -> " + dataplane.DescribeBackends(v.Have)
	switch {
	case !v.Present:
		state = "MISSING"
	case !v.Matches:
		state = "DIFFERS: sends to " + dataplane.DescribeBackends(v.Have)
	}
	return []string{fmt.Sprintf("%s (virtual server %s): %s", v.Frontend, v.VirtualServer, state)}
}

// unmarked stands for the mark of a frontend whose node traffic the rules
// do not mark: it is no mark of kpr's (ownMark), so no virtual server of
// kpr's has it.
const unmarked = masqMark

// InspectPorts is the virtual servers of each frontend of ports, and every
// virtual server, real server, address and set member kpr writes for them
// that the kernel lacks or holds otherwise.
func (in *Inspector) InspectPorts(ports []dataplane.ServicePort) (dataplane.Inspection, error) {
	out := dataplane.Inspection{Key: "virtualServers", Title: "IPVS virtual servers", Rows: []dataplane.InspectedRow{}, Divergences: []string{},
		Agrees: "IPVS holds exactly what kpr writes for this Service"}
	diverge := func(format string, args ...any) {
		out.Divergences = append(out.Divergences, fmt.Sprintf(format, args...))
	}
	for i := range ports {
		// The marks are the ones the nat rules give; desire only asks
		// for one where the node's own traffic needs its own virtual
		// server.
		c, err := desire(&ports[i], DefaultScheduler, in.p.ipv6(), func(k ServiceKey) uint32 {
			if m, ok := in.cur.internal[k]; ok {
				return m
			}
			return unmarked
		})
		if err != nil {
			return out, err
		}
		var fronts []ServiceKey
		for k := range c.services {
			if k.FWMark == 0 {
				fronts = append(fronts, k)
			}
		}
		slices.SortFunc(fronts, compareKeys)
		for _, k := range fronts {
			out.Rows = append(out.Rows, in.virtualServer(k.String(), c.services[k], diverge))
			mark, ok := c.internal[k]
			if !ok {
				continue
			}
			if mark == unmarked {
				diverge("%s: the node's own traffic to it is to get other backends than traffic from outside (externalTrafficPolicy Local), "+
					"but no rule in nat %s marks it for a virtual server of its own; it gets the outside's. The next full reconcile rewrites the rules.", k, chainInternal)
				continue
			}
			mk := ServiceKey{IPv6: k.IPv6, FWMark: mark}
			out.Rows = append(out.Rows, in.virtualServer(k.String()+" from this node", c.services[mk], diverge))
		}
		for _, a := range c.bind {
			if !in.cur.bound[a] {
				diverge("%s is not bound to %s: the node does not take packets to it for IPVS", a, DeviceName)
			}
		}
		for _, e := range c.entries {
			if !in.cur.entries[e] {
				diverge("ipset %s lacks %s: the rules that match the set (masquerade, source ranges) miss it", e.set, e.entry)
			}
		}
	}
	return out, nil
}

// virtualServer compares the virtual server kpr wants with the kernel's.
func (in *Inspector) virtualServer(frontend string, want *wantService, diverge func(string, ...any)) VirtualServer {
	v := VirtualServer{Frontend: frontend, VirtualServer: want.Key.String(), Want: dataplane.BackendStrings(want.backends), Have: []string{}}
	have := in.cur.services[want.Key]
	if have == nil {
		diverge("%s: no virtual server %s (deleted by hand, or not synced yet); connections to it are not served by IPVS. "+
			"The next full reconcile rewrites it.", frontend, want.Key)
		return v
	}
	v.Present, v.PersistenceSeconds = true, have.Timeout
	var serving []dataplane.Backend
	for _, b := range sortedBackends(have.Dests) {
		if have.Dests[b].Weight > 0 {
			serving = append(serving, b)
		} else {
			v.Draining = append(v.Draining, b.String())
		}
	}
	v.Have = dataplane.BackendStrings(serving)
	v.Matches = slices.Equal(v.Have, v.Want) && have.Timeout == want.Timeout
	if !slices.Equal(v.Have, v.Want) {
		diverge("%s: virtual server %s sends to %v, kpr wants %v", frontend, want.Key, v.Have, v.Want)
	}
	if have.Timeout != want.Timeout {
		diverge("%s: virtual server %s has a persistence timeout of %ds, kpr wants %ds", frontend, want.Key, have.Timeout, want.Timeout)
	}
	return v
}

// Fill is how many of one kind of IPVS-mode object the node holds.
type Fill struct {
	Table   string `json:"table"`
	Entries int    `json:"entries"`
}

// Columns names the table and its count.
func (f Fill) Columns() []string { return []string{f.Table, fmt.Sprint(f.Entries)} }

// InspectNode is how many virtual servers, real servers, bound addresses,
// set members and rules of kpr's the node holds.
func (in *Inspector) InspectNode() []dataplane.Inspection {
	dests := 0
	for _, s := range in.cur.services {
		dests += len(s.Dests)
	}
	rows := []dataplane.InspectedRow{
		Fill{"virtual servers", len(in.cur.services)},
		Fill{"real servers", dests},
		Fill{"addresses on " + DeviceName, len(in.cur.bound)},
	}
	for _, s := range setSpecs() {
		if s.IPv6 && !in.p.ipv6() {
			continue
		}
		n := 0
		for e := range in.cur.entries {
			if e.set == s.Name {
				n++
			}
		}
		rows = append(rows, Fill{"ipset " + s.Name, n})
	}
	for _, fam := range in.p.families {
		for _, table := range tables {
			n := 0
			for _, chain := range chainsOf(table) {
				n += len(in.saved[fam][table].ChainRules(chain))
			}
			rows = append(rows, Fill{fmt.Sprintf("%s %s rules in %s* chains", fam, table, chainPrefix), n})
		}
	}
	return []dataplane.Inspection{{Key: "ipvs", Title: "IPVS state kpr owns", Rows: rows}}
}
