package iptables

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/metrics"
)

// Options configure a Plane.
type Options struct {
	// Runner runs the binaries; required.
	Runner netfilter.Runner
	// Families maps each family the Plane programs to its binaries. A
	// family left out is not programmed (its frontends are not served).
	Families map[netfilter.Family]netfilter.Tools
	// Conntrack deletes the UDP conntrack entries that no longer match
	// the rules (see netfilter.UDPConntrack); nil skips it.
	Conntrack netfilter.ConntrackCleaner
	// Masquerade is kube-proxy's --masquerade-all and --detect-local-mode.
	Masquerade netfilter.Masquerade
	// LocalhostNodePorts serves NodePorts on 127.0.0.0/8, as kube-proxy's
	// --iptables-localhost-nodeports does where --nodeport-addresses
	// covers loopback; without it NodePort frontends on IPv4 loopback
	// are left out. It needs route_localnet (see PrepareNamespace), and
	// with it the Plane writes KUBE-FIREWALL's drop of packets to
	// 127.0.0.0/8 from outside.
	LocalhostNodePorts bool
	// ConntrackTCPLiberal is nf_conntrack_tcp_be_liberal set in the
	// namespace: KUBE-FORWARD then does not drop conntrack-INVALID
	// packets, as kube-proxy does not (see PrepareNamespace).
	ConntrackTCPLiberal bool
	// Metrics takes kube-proxy's rule counts and restore failures; nil
	// reports nothing.
	Metrics metrics.IPTablesReporter
	Log     *zap.Logger
}

// Plane is the iptables dataplane.Dataplane.
type Plane struct {
	run       netfilter.Runner
	families  []netfilter.Family
	tools     map[netfilter.Family]netfilter.Tools
	conntrack *netfilter.UDPConntrack
	cfg       config
	log       *zap.Logger
	metrics   metrics.IPTablesReporter

	// programmed is what the tables hold as far as this Plane wrote them.
	programmed map[dataplane.ServicePortName]*dataplane.ServicePort
	// rendered caches the rules of each programmed ServicePort; a
	// ServicePort handed over never changes, so the pointer keys it.
	rendered map[dataplane.ServicePortName]*renderedPort
	// checked is set once the Plane has read a family's tables and put
	// the base jumps in place; every Reconcile checks again.
	checked map[netfilter.Family]bool
	// dirty is set by a failed call and cleared by a successful
	// Reconcile: until then no drift check vouches for the tables.
	dirty bool
	// writes counts the calls that wrote (or tried to), so that a drift
	// check knows when a table it read may show a later state than the
	// one it compares it with.
	writes uint64
}

type renderedPort struct {
	sp    *dataplane.ServicePort
	rules map[netfilter.Family]*portRules
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New returns a Plane; it reads and writes nothing until the first call.
func New(o Options) (*Plane, error) {
	if o.Runner == nil || len(o.Families) == 0 {
		return nil, errors.New("iptables.New: Options need a Runner and at least one family's Tools")
	}
	p := &Plane{
		run: o.Runner, tools: o.Families, log: o.Log, metrics: o.Metrics,
		cfg:        config{masq: o.Masquerade, localhostNodePorts: o.LocalhostNodePorts, tcpLiberal: o.ConntrackTCPLiberal},
		programmed: map[dataplane.ServicePortName]*dataplane.ServicePort{},
		rendered:   map[dataplane.ServicePortName]*renderedPort{},
		checked:    map[netfilter.Family]bool{},
	}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	p.families = netfilter.FamiliesOf(o.Families)
	p.conntrack = netfilter.NewUDPConntrack(o.Conntrack, p.families, p.log)
	return p, nil
}

// Apply writes the changed ServicePorts' chains and rewrites the shared
// chains; the chains of every other ServicePort are left as they are.
func (p *Plane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	next, changed := dataplane.AfterApply(p.programmed, changes)
	if len(changed) == 0 {
		return nil
	}
	return p.write(next, changed, false)
}

// Reconcile rewrites every chain from all and deletes the per-ServicePort
// chains nobody owns, whoever left them.
func (p *Plane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	next, changed := dataplane.AfterReconcile(p.programmed, all)
	return p.write(next, changed, true)
}

// tableWrite is what one call writes into one table of one family: one
// iptables-restore transaction, or several for a table too large for one
// (Tools.SplitLines), and how to undo it should a later write of the same
// call fail.
type tableWrite struct {
	fam   netfilter.Family
	table string
	parts [][]byte
	// back renders the undo, split as the write was, only when needed.
	back func() [][]byte
}

// write brings the tables from p.programmed to next. changed are the
// ServicePorts whose chains are rewritten (all of them when full). Each
// transaction is atomic; when one fails, what the call wrote before it is
// undone by writing the previous state of the changed ServicePorts back,
// so that every ServicePort is left wholly as it was. That holds for a
// table written in parts too: its undo rewrites every changed
// ServicePort's old chains, then the old shared chains. The transactions
// of a family are ordered by writeSteps, so that a packet meets at every
// moment either the filter rules or the nat rules of its Service.
func (p *Plane) write(next map[dataplane.ServicePortName]*dataplane.ServicePort, changed []dataplane.ServicePortName, full bool) error {
	p.writes++
	slices.SortFunc(changed, dataplane.ServicePortName.Compare)
	nextRendered := map[dataplane.ServicePortName]*renderedPort{}
	for n, sp := range next {
		if r := p.rendered[n]; r != nil && r.sp == sp {
			nextRendered[n] = r
		} else {
			nextRendered[n] = render(sp, p.families, p.cfg)
		}
	}

	prev := p.rendered
	kept := keptFilterRules(prev, nextRendered, changed)
	var writes []tableWrite
	for _, fam := range p.families {
		var saved map[string]*netfilter.SavedTable
		if full || !p.checked[fam] {
			var err error
			if saved, err = p.save(fam); err != nil {
				return err
			}
		}
		// A family whose tables were read is written whole: that is the
		// first write, or a full sync, and either may find them changed.
		whole := saved != nil
		famKept, famChanged := kept, changed
		if whole {
			famKept, famChanged = withStaleStops(kept, changed, fam, saved[tableFilter])
		}
		splitLines := p.tools[fam].SplitLines
		for _, s := range writeSteps(prev, famKept, nextRendered, whole) {
			fwd := tableInputOf(fam, s.table, p.cfg, s.to, s.from, famChanged, s.whole)
			if s.whole {
				fwd.jumps = netfilter.MissingJumps(s.table, baseJumpsOf(fam, p.cfg), saved[s.table])
				if full && s.table == tableNAT {
					fwd.remove = mergeNames(fwd.remove, staleChains(saved[s.table], fwd.ports))
				}
			}
			if fwd.writesNothing() {
				continue // e.g. the filter table, or the other family, when only endpoints changed
			}
			w := tableWrite{fam: fam, table: s.table, parts: renderAll(fwd.split(splitLines)),
				back: func() [][]byte {
					return renderAll(tableInputOf(fam, s.table, p.cfg, s.from, s.to, famChanged, s.whole).split(splitLines))
				}}
			if len(w.parts) > 1 {
				p.log.Debug("Writing a large table in parts", zap.Stringer("family", fam), zap.String("table", s.table),
					zap.Int("lines", fwd.rewriteLines()), zap.Int("parts", len(w.parts)))
			}
			writes = append(writes, w)
		}
	}

	for i, w := range writes {
		for k, part := range w.parts {
			err := p.restore(w.fam, part)
			if err == nil {
				continue
			}
			err = fmt.Errorf("write the %s %s table: %w", w.fam, w.table, err)
			undo := writes[:i]
			if k > 0 {
				undo = writes[:i+1] // its first parts went in
			}
			for j := len(undo) - 1; j >= 0; j-- {
				if undoErr := p.restoreAll(undo[j].fam, undo[j].back()); undoErr != nil {
					err = errors.Join(err, fmt.Errorf("undo the %s %s table (it now holds the new rules of up to %d ServicePorts): %w",
						undo[j].fam, undo[j].table, len(changed), undoErr))
				}
			}
			p.dirty = true
			return err
		}
	}

	old := p.programmed
	p.programmed, p.rendered = next, nextRendered
	p.reportRules(writes)
	if full {
		p.dirty = false
	}
	for _, fam := range p.families {
		p.checked[fam] = true
	}
	p.conntrack.Synced(old, next, changed, full)
	return nil
}

// writeStep is one transaction of a family: table brought from the
// rules of from to those of to, whole (every shared chain, and the
// base jumps the table lacks) or only where they differ.
type writeStep struct {
	table    string
	from, to map[dataplane.ServicePortName]*renderedPort
	whole    bool
}

// writeSteps orders a family's transactions from prev to next. The
// filter table and the nat table commit separately, and between the two
// a packet meets the new rules of one and the old of the other. The
// filter rules that stop a Service's packets (the REJECT without
// endpoints, the DROP of outside traffic under a Local policy without
// local endpoints, the DROP of sources outside loadBalancerSourceRanges)
// match the Service's address, which a packet has only when nat did not
// translate it: filter INPUT, FORWARD and OUTPUT come after nat's DNAT.
// So those rules may stand beside any nat rules, and the filter table is
// written twice around the nat table: first with the rules of prev and
// next both (kept, see keptFilterRules), then, once the nat table is in,
// with next's alone. A Service gaining its first endpoint keeps its
// REJECT until its DNAT is in; one losing its last has its REJECT before
// its DNAT goes. Written once before the nat table, as kube-proxy writes
// it, a Service gaining its first endpoint had neither for a moment, and
// its connects left untranslated. Either filter write is skipped when it
// would change nothing, so a call writes the filter table twice only when
// it both adds and removes such rules.
//
// Undoing the steps in reverse, each writes the rules of its from: the
// nat table is put back while the filter table still holds kept.
func writeSteps(prev, kept, next map[dataplane.ServicePortName]*renderedPort, whole bool) []writeStep {
	return []writeStep{
		{table: tableFilter, from: prev, to: kept, whole: whole},
		{table: tableNAT, from: prev, to: next, whole: whole},
		{table: tableFilter, from: kept, to: next},
	}
}

// keptFilterRules is the filter rules between prev and next: each
// changed ServicePort's filter lines in either; the others as they are in
// next. Only the filter table is written from it.
func keptFilterRules(prev, next map[dataplane.ServicePortName]*renderedPort, changed []dataplane.ServicePortName) map[dataplane.ServicePortName]*renderedPort {
	kept := make(map[dataplane.ServicePortName]*renderedPort, len(next))
	for n, r := range next {
		kept[n] = r
	}
	for _, n := range changed {
		before, after := prev[n], next[n]
		switch {
		case before == nil:
			// New, or neither: next's rules, if any.
		case after == nil:
			kept[n] = before // deleted: its filter rules go after its nat rules
		default:
			if k := keptPort(before, after); k != nil {
				kept[n] = k
			}
		}
	}
	return kept
}

// keptPort is after with the filter lines of before that it lacks (see
// unionLines), nil when it lacks none, as after an endpoint change that
// leaves the Service with endpoints.
func keptPort(before, after *renderedPort) *renderedPort {
	var k *renderedPort
	for fam, a := range after.rules {
		b := before.rules[fam]
		if b == nil || (containsAll(a.filterServices, b.filterServices) &&
			containsAll(a.filterExternal, b.filterExternal) && containsAll(a.filterFirewall, b.filterFirewall)) {
			continue
		}
		if k == nil {
			k = &renderedPort{rules: maps.Clone(after.rules)}
		}
		k.rules[fam] = &portRules{
			filterServices: unionLines(b.filterServices, a.filterServices),
			filterExternal: unionLines(b.filterExternal, a.filterExternal),
			filterFirewall: unionLines(b.filterFirewall, a.filterFirewall),
		}
	}
	return k
}

// unionLines is the lines of before and after, each once: one of the two
// when it holds every line of the other, so that a write from or to it
// finds nothing changed; else before's, then after's new ones.
func unionLines(before, after []string) []string {
	switch {
	case containsAll(after, before):
		return after
	case containsAll(before, after):
		return before
	}
	out := slices.Clone(before)
	for _, l := range after {
		if !slices.Contains(before, l) {
			out = append(out, l)
		}
	}
	return out
}

func containsAll(set, lines []string) bool {
	for _, l := range lines {
		if !slices.Contains(set, l) {
			return false
		}
	}
	return true
}

func render(sp *dataplane.ServicePort, families []netfilter.Family, cfg config) *renderedPort {
	r := &renderedPort{sp: sp, rules: map[netfilter.Family]*portRules{}}
	for _, fam := range families {
		pr := renderPort(sp, fam, cfg)
		r.rules[fam] = &pr
	}
	return r
}

// tableInputOf is the transaction that writes state for fam and table, rewriting
// the chains of changed and deleting those of their chains that other (the
// state being left) had and state does not. A whole input writes every
// shared chain and every changed ServicePort's chains; otherwise only what
// differs from other is written.
func tableInputOf(fam netfilter.Family, table string, cfg config, state, other map[dataplane.ServicePortName]*renderedPort, changed []dataplane.ServicePortName, whole bool) tableInput {
	in := tableInput{fam: fam, table: table, cfg: cfg}
	for _, c := range sharedChainsOf(table, fam, cfg) {
		if whole || slices.ContainsFunc(changed, func(n dataplane.ServicePortName) bool {
			return c.changedIn(state[n].rulesOf(fam), other[n].rulesOf(fam))
		}) {
			in.shared = append(in.shared, c)
		}
	}
	// Every ServicePort's rules, in name order, are needed only to write
	// a shared chain whole (or, whole, to find stale chains): most
	// partial syncs write none, and sorting 10,000 names is not free.
	if whole || slices.ContainsFunc(in.shared, func(c sharedChain) bool { return c.lines != nil }) {
		names := make([]dataplane.ServicePortName, 0, len(state))
		for n := range state {
			names = append(names, n)
		}
		slices.SortFunc(names, dataplane.ServicePortName.Compare)
		for _, n := range names {
			in.ports = append(in.ports, state[n].rules[fam])
		}
	}
	if table != tableNAT {
		return in
	}
	for _, n := range changed {
		now, before := state[n].rulesOf(fam), other[n].rulesOf(fam)
		if !whole && sameChains(now, before) {
			continue
		}
		var keep []string
		if now != nil {
			in.rewrite = append(in.rewrite, now)
			keep = now.chainNames()
		}
		if before != nil {
			for _, c := range before.chainNames() {
				if !slices.Contains(keep, c) {
					in.remove = append(in.remove, c)
				}
			}
		}
	}
	return in
}

// rulesOf is the ServicePort's rules in fam, nil for a ServicePort not
// rendered.
func (r *renderedPort) rulesOf(fam netfilter.Family) *portRules {
	if r == nil {
		return nil
	}
	return r.rules[fam]
}

// sameChains reports whether two renderings of a ServicePort own the same
// chains with the same rules (nil owns none).
func sameChains(a, b *portRules) bool {
	var ac, bc []chain
	if a != nil {
		ac = a.chains
	}
	if b != nil {
		bc = b.chains
	}
	return slices.EqualFunc(ac, bc, func(x, y chain) bool { return x.name == y.name && slices.Equal(x.rules, y.rules) })
}

func mergeNames(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

func (p *Plane) save(fam netfilter.Family) (map[string]*netfilter.SavedTable, error) {
	out := map[string]*netfilter.SavedTable{}
	for _, table := range tables {
		text, err := p.run.Run(p.tools[fam].Save, []string{"-t", table}, nil)
		if err != nil {
			return nil, fmt.Errorf("read the %s %s table: %w", fam, table, err)
		}
		parsed, err := netfilter.ParseSave(text)
		if err != nil {
			return nil, fmt.Errorf("read the %s %s table: %w", fam, table, err)
		}
		// A table the kernel has not created yet saves as nothing.
		out[table] = parsed[table]
	}
	// The UDP frontends the rules serve, whoever wrote them: after a
	// restart, those of Services deleted meanwhile still have conntrack
	// entries that only this reading can name.
	p.conntrack.FoundInKernel(netfilter.UDPFrontendsOfRules(out[tableNAT], chainServices, chainNodePorts))
	p.conntrack.FoundInKernel(netfilter.UDPFrontendsOfRules(out[tableFilter], chainServices, chainExternalServices))
	return out, nil
}

// restoreAll runs the transactions in order, stopping at the first that
// fails.
func (p *Plane) restoreAll(fam netfilter.Family, inputs [][]byte) error {
	for _, in := range inputs {
		if err := p.restore(fam, in); err != nil {
			return err
		}
	}
	return nil
}

func renderAll(ins []tableInput) [][]byte {
	out := make([][]byte, len(ins))
	for i, in := range ins {
		out[i] = in.render()
	}
	return out
}

func (p *Plane) restore(fam netfilter.Family, input []byte) error {
	_, err := p.run.Run(p.tools[fam].Restore, []string{"--noflush"}, input)
	if err != nil {
		p.reportRestoreFailure(fam)
	}
	return err
}
