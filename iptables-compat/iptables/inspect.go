package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// Reading the tables back for `kpr explain`: what the kernel's rules do
// with one ServicePort's frontends, and every way they differ from what
// this backend writes for it. The comparison is against renderPort's own
// output, rule by rule through fingerprint as the drift check compares, so
// the reader holds no second notion of what the rules should be.

// Tables is one reading of the nat and filter tables of every family.
type Tables struct {
	families []netfilter.Family
	cfg      config
	saved    map[netfilter.Family]map[string]*netfilter.SavedTable
}

// ReadTables reads the tables of o's families with iptables-save, through
// the same calls the Plane's full sync makes.
func ReadTables(o Options) (*Tables, error) {
	p, err := New(o)
	if err != nil {
		return nil, err
	}
	t := &Tables{families: p.families, cfg: p.cfg, saved: map[netfilter.Family]map[string]*netfilter.SavedTable{}}
	for _, fam := range p.families {
		if t.saved[fam], err = p.save(fam); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// FrontendRules is what one family's tables do with one frontend.
type FrontendRules struct {
	// Frontend is address:port/protocol.
	Frontend string `json:"frontend"`
	// Jump is the chain the frontend's rule in nat KUBE-SERVICES or
	// KUBE-NODEPORTS jumps to; empty when the table has no such rule.
	Jump string `json:"jump,omitempty"`
	// Backends are the DNAT destinations the chains reach from Jump,
	// sorted (for a Local policy both the node's and the outside's set).
	Backends []string `json:"backends"`
	// Rejected is set when a filter rule rejects or drops new
	// connections to the frontend (no endpoints, or no local ones for
	// traffic from outside).
	Rejected bool `json:"rejected,omitempty"`
}

// PortRules is what the tables hold for one ServicePort.
type PortRules struct {
	Frontends []FrontendRules `json:"frontends"`
	// Divergences name every rule and chain kpr writes for the
	// ServicePort that the tables lack or hold otherwise, and every rule
	// of the ServicePort kpr does not write; empty when they match.
	Divergences []string `json:"divergences"`
}

// Inspect reports what the tables hold for sp and how that differs from
// what the Plane writes for it.
func (t *Tables) Inspect(sp *dataplane.ServicePort) PortRules {
	out := PortRules{Frontends: []FrontendRules{}, Divergences: []string{}}
	name := portName(sp.Name)
	for _, fam := range t.families {
		nat, filter := t.saved[fam][tableNAT], t.saved[fam][tableFilter]
		want := renderPort(sp, fam, t.cfg)
		for _, fe := range sp.Frontends {
			if netfilter.FamilyOf(fe.Addr) == fam && servable(fe, t.cfg.localhostNodePorts) {
				out.Frontends = append(out.Frontends, frontendRules(nat, filter, fe))
			}
		}
		diverge := func(format string, args ...any) {
			out.Divergences = append(out.Divergences, fmt.Sprintf("%s ", fam)+fmt.Sprintf(format, args...))
		}
		shared := []struct {
			table, chain string
			saved        *netfilter.SavedTable
			want         []string
		}{
			{tableNAT, chainServices, nat, want.natServices},
			{tableNAT, chainNodePorts, nat, want.natNodePorts},
			{tableFilter, chainServices, filter, want.filterServices},
			{tableFilter, chainExternalServices, filter, want.filterExternal},
		}
		for _, s := range shared {
			// Other ServicePorts share these chains: only the rules
			// whose comment names this one are its.
			compareRules(rulesOf(s.saved, s.chain, name), s.want, func(what, rule string) {
				diverge("%s %s %s: %s", s.table, s.chain, what, rule)
			})
		}
		wantChains := map[string]bool{}
		for _, c := range want.chains {
			wantChains[c.name] = true
			if !nat.HasChain(c.name) {
				diverge("nat chain %s is missing (%s)", c.name, chainRole(c))
				continue
			}
			compareRules(rulesOf(nat, c.name, ""), c.rules, func(what, rule string) {
				diverge("nat %s %s: %s", c.name, what, rule)
			})
		}
		// A chain of the ServicePort kpr does not write (an endpoint that
		// left, added by hand) still catches traffic if something jumps
		// to it.
		for _, c := range chainsOf(nat, name) {
			if !wantChains[c] {
				diverge("nat chain %s belongs to %s but kpr does not write it", c, name)
			}
		}
	}
	return out
}

// compareRules reports each rule of want that have lacks ("lacks the
// rule") and each rule of have that want lacks ("has a rule kpr does not
// write"), compared by what they do.
func compareRules(have [][]string, want []string, report func(what, rule string)) {
	haveFP := make([]string, len(have))
	for i, r := range have {
		haveFP[i] = fingerprint(r)
	}
	used := make([]bool, len(have))
	for _, l := range want {
		words, err := netfilter.SplitWords(l)
		if err != nil {
			report("cannot read kpr's own rule", l) // renderPort's output always splits
			continue
		}
		fp := fingerprint(words)
		i := slices.IndexFunc(haveFP, func(h string) bool { return h == fp })
		for i >= 0 && used[i] {
			next := slices.IndexFunc(haveFP[i+1:], func(h string) bool { return h == fp })
			if next < 0 {
				i = -1
				break
			}
			i += 1 + next
		}
		if i < 0 {
			report("lacks the rule", l)
			continue
		}
		used[i] = true
	}
	for i, r := range have {
		if !used[i] {
			report("has a rule kpr does not write", joinRule(r))
		}
	}
}

// chainRole says what a chain of a ServicePort is for, from its name.
func chainRole(c chain) string {
	switch {
	case strings.HasPrefix(c.name, prefixEndpoint):
		for _, r := range c.rules {
			if words, err := netfilter.SplitWords(r); err == nil && netfilter.RuleArg(words, "--to-destination") != "" {
				return "the endpoint " + netfilter.RuleArg(words, "--to-destination")
			}
		}
		return "an endpoint"
	case strings.HasPrefix(c.name, prefixExternal):
		return "traffic from outside and to NodePorts"
	case strings.HasPrefix(c.name, prefixLocalPolicy):
		return "the node-local endpoints"
	}
	return "every endpoint"
}

// frontendRules follows fe through the saved tables.
func frontendRules(nat, filter *netfilter.SavedTable, fe dataplane.Frontend) FrontendRules {
	fr := FrontendRules{
		Frontend: netip.AddrPortFrom(fe.Addr.Unmap(), fe.Port).String() + "/" + fe.Protocol.String(),
		Backends: []string{},
	}
	entry := chainServices
	if fe.Kind == dataplane.NodePort {
		entry = chainNodePorts
	}
	for _, r := range rulesOf(nat, entry, "") {
		if matchesFrontend(r, fe) {
			fr.Jump = netfilter.RuleArg(r, "-j")
			break
		}
	}
	if fr.Jump != "" {
		fr.Backends = destinations(nat, fr.Jump, map[string]bool{})
		slices.Sort(fr.Backends)
		fr.Backends = slices.Compact(fr.Backends)
	}
	for _, c := range []string{chainServices, chainExternalServices} {
		for _, r := range rulesOf(filter, c, "") {
			if matchesFrontend(r, fe) && (netfilter.RuleArg(r, "-j") == "REJECT" || netfilter.RuleArg(r, "-j") == "DROP") {
				fr.Rejected = true
			}
		}
	}
	return fr
}

// matchesFrontend reports whether rule r matches traffic to fe.
func matchesFrontend(r []string, fe dataplane.Frontend) bool {
	return normalAddr(netfilter.RuleArg(r, "-d")) == fe.Addr.Unmap().String() &&
		netfilter.RuleArg(r, "--dport") == strconv.Itoa(int(fe.Port)) &&
		netfilter.RuleArg(r, "-p") == netfilter.ProtoName(fe.Protocol)
}

// destinations are the DNAT targets reachable from chain through the
// backend's chains.
func destinations(t *netfilter.SavedTable, chain string, seen map[string]bool) []string {
	if seen[chain] || !ownedChain(chain) {
		return nil
	}
	seen[chain] = true
	var out []string
	for _, r := range rulesOf(t, chain, "") {
		switch target := netfilter.RuleArg(r, "-j"); {
		case target == "DNAT":
			out = append(out, netfilter.RuleArg(r, "--to-destination"))
		case ownedChain(target):
			out = append(out, destinations(t, target, seen)...)
		}
	}
	return out
}

// rulesOf returns the rules of chain; with a name, only those whose
// comment is the ServicePort's name or starts with it and a blank, as
// every comment kpr puts on a ServicePort's rules does.
func rulesOf(t *netfilter.SavedTable, chain, name string) [][]string {
	if t == nil {
		return nil
	}
	var out [][]string
	for _, r := range t.Rules {
		if r[1] == chain && (name == "" || commentNames(r, name)) {
			out = append(out, r)
		}
	}
	return out
}

// chainsOf returns the per-ServicePort chains with a rule commented with
// name.
func chainsOf(t *netfilter.SavedTable, name string) []string {
	if t == nil {
		return nil
	}
	var out []string
	for _, r := range t.Rules {
		if ownedChain(r[1]) && commentNames(r, name) && !slices.Contains(out, r[1]) {
			out = append(out, r[1])
		}
	}
	return out
}

func commentNames(r []string, name string) bool {
	c := netfilter.RuleArg(r, "--comment")
	return c == name || strings.HasPrefix(c, name+" ")
}

// joinRule spells a saved rule as iptables-save prints it, quoting words
// with blanks.
func joinRule(r []string) string {
	words := make([]string, len(r))
	for i, w := range r {
		if strings.ContainsAny(w, " \t") {
			w = `"` + w + `"`
		}
		words[i] = w
	}
	return strings.Join(words, " ")
}

// Size is how many chains and rules of the backend's a family's tables
// hold: the chains it names (KUBE-*), built-in ones' jumps left out.
// It is the iptables mode's counterpart of map fill.
type Size struct {
	Family string `json:"family"`
	Chains int    `json:"chains"`
	Rules  int    `json:"rules"`
}

// Sizes returns the Size of each family read.
func (t *Tables) Sizes() []Size {
	out := []Size{}
	for _, fam := range t.families {
		s := Size{Family: fam.String()}
		for _, table := range tables {
			saved := t.saved[fam][table]
			if saved == nil {
				continue
			}
			for _, c := range saved.Chains {
				if strings.HasPrefix(c, "KUBE-") {
					s.Chains++
				}
			}
			for _, r := range saved.Rules {
				if strings.HasPrefix(r[1], "KUBE-") {
					s.Rules++
				}
			}
		}
		out = append(out, s)
	}
	return out
}

// The iptables mode answers `kpr explain` and `kpr status` through its
// Inspector, from one reading of the tables.

var _ dataplane.Inspector = (*Inspector)(nil)

// InspectPorts is what the rules do with each frontend of ports, and every
// rule in which they differ from what the Plane writes.
func (in *Inspector) InspectPorts(ports []dataplane.ServicePort) (dataplane.Inspection, error) {
	out := dataplane.Inspection{Key: "rules", Title: "iptables rules", Rows: []dataplane.InspectedRow{}, Divergences: []string{},
		Agrees: "the rules hold exactly what kpr writes for this Service"}
	for i := range ports {
		pr := in.tables.Inspect(&ports[i])
		for _, fr := range pr.Frontends {
			out.Rows = append(out.Rows, fr)
		}
		out.Divergences = append(out.Divergences, pr.Divergences...)
	}
	return out, nil
}

// InspectNode is how many chains and rules kpr's tables hold per family.
func (in *Inspector) InspectNode() []dataplane.Inspection {
	out := dataplane.Inspection{Key: "rules", Title: "iptables rules in kpr's chains (KUBE-*)", Rows: []dataplane.InspectedRow{}}
	for _, s := range in.tables.Sizes() {
		out.Rows = append(out.Rows, s)
	}
	return []dataplane.Inspection{out}
}

// Close releases nothing: the reading is in memory.
func (in *Inspector) Close() {}

// Columns says where the frontend's traffic goes.
func (r FrontendRules) Columns() []string {
	state := "no rule sends it anywhere"
	if r.Jump != "" {
		state = r.Jump + " -> " + dataplane.DescribeBackends(r.Backends)
	}
	if r.Rejected {
		state += "; new connections rejected"
	}
	return []string{r.Frontend + ": " + state}
}

// Columns says how many chains and rules the family holds.
func (s Size) Columns() []string {
	return []string{fmt.Sprintf("%s: %d chains, %d rules", s.Family, s.Chains, s.Rules)}
}
