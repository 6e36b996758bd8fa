package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
)

// Options configure a Plane.
type Options struct {
	// Runner runs the binaries; required.
	Runner Runner
	// Families maps each family the Plane programs to its binaries. A
	// family left out is not programmed (its frontends are not served).
	Families map[Family]Tools
	// Conntrack removes the entries of UDP backends that left; nil
	// skips it.
	Conntrack ConntrackCleaner
	// Masquerade is kube-proxy's --masquerade-all and --cluster-cidr.
	Masquerade Masquerade
	Log        *zap.Logger
}

// Masquerade says which ClusterIP traffic kube-proxy's KUBE-SVC-* chains
// mark for masquerading: all of it (--masquerade-all), or what does not
// come from the pods (--cluster-cidr), so that a node reached through a
// static route to the Service range answers through itself. Neither marks
// none, as kube-proxy without a local-traffic detector.
type Masquerade struct {
	All bool
	// ClusterCIDRs are the pod ranges, at most one per family (kube-proxy's
	// limit); traffic from outside them is masqueraded.
	ClusterCIDRs []netip.Prefix
}

// clusterCIDR is the pod range of fam, if one was given.
func (m Masquerade) clusterCIDR(fam Family) (netip.Prefix, bool) {
	for _, c := range m.ClusterCIDRs {
		if familyOf(c.Addr()) == fam {
			return c, true
		}
	}
	return netip.Prefix{}, false
}

// Plane is the iptables dataplane.Dataplane.
type Plane struct {
	run       Runner
	families  []Family
	tools     map[Family]Tools
	conntrack ConntrackCleaner
	masq      Masquerade
	log       *zap.Logger

	// programmed is what the tables hold as far as this Plane wrote them.
	programmed map[dataplane.ServicePortName]*dataplane.ServicePort
	// rendered caches the rules of each programmed ServicePort; a
	// ServicePort handed over never changes, so the pointer keys it.
	rendered map[dataplane.ServicePortName]*renderedPort
	// checked is set once the Plane has read a family's tables and put
	// the base jumps in place; every Reconcile checks again.
	checked map[Family]bool
	// dirty is set by a failed call and cleared by a successful
	// Reconcile: until then no drift check vouches for the tables.
	dirty bool
}

type renderedPort struct {
	sp    *dataplane.ServicePort
	rules map[Family]*portRules
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New returns a Plane; it reads and writes nothing until the first call.
func New(o Options) (*Plane, error) {
	if o.Runner == nil || len(o.Families) == 0 {
		return nil, errors.New("iptables.New: Options need a Runner and at least one family's Tools")
	}
	p := &Plane{
		run: o.Runner, tools: o.Families, conntrack: o.Conntrack, masq: o.Masquerade, log: o.Log,
		programmed: map[dataplane.ServicePortName]*dataplane.ServicePort{},
		rendered:   map[dataplane.ServicePortName]*renderedPort{},
		checked:    map[Family]bool{},
	}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	for _, f := range []Family{IPv4, IPv6} {
		if _, ok := o.Families[f]; ok {
			p.families = append(p.families, f)
		}
	}
	return p, nil
}

// Apply writes the changed ServicePorts' chains and rewrites the shared
// chains; the chains of every other ServicePort are left as they are.
func (p *Plane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	next := clone(p.programmed)
	var changed []dataplane.ServicePortName
	for n, sp := range changes {
		if sp == nil {
			if _, ok := next[n]; !ok {
				continue // deleting what was never written
			}
			delete(next, n)
		} else {
			next[n] = sp
		}
		changed = append(changed, n)
	}
	if len(changed) == 0 {
		return nil
	}
	return p.write(next, changed, false)
}

// Reconcile rewrites every chain from all and deletes the per-ServicePort
// chains nobody owns, whoever left them.
func (p *Plane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	next := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for n, sp := range all {
		if sp != nil {
			next[n] = sp
		}
	}
	var changed []dataplane.ServicePortName
	for n := range next {
		changed = append(changed, n)
	}
	for n := range p.programmed {
		if _, ok := next[n]; !ok {
			changed = append(changed, n)
		}
	}
	return p.write(next, changed, true)
}

func clone(m map[dataplane.ServicePortName]*dataplane.ServicePort) map[dataplane.ServicePortName]*dataplane.ServicePort {
	out := make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(m))
	for n, sp := range m {
		out[n] = sp
	}
	return out
}

// transaction is one iptables-restore of one table of one family, and the
// one that undoes it should a later transaction of the same call fail.
type transaction struct {
	fam     Family
	table   string
	forward []byte
	// back renders the undo only when it is needed.
	back func() []byte
}

// write brings the tables from p.programmed to next. changed are the
// ServicePorts whose chains are rewritten (all of them when full). Each
// transaction is atomic; when one fails, the ones before it are undone by
// writing the previous state of the changed ServicePorts back, so that
// every ServicePort is left wholly as it was.
func (p *Plane) write(next map[dataplane.ServicePortName]*dataplane.ServicePort, changed []dataplane.ServicePortName, full bool) error {
	slices.SortFunc(changed, compareNames)
	nextRendered := map[dataplane.ServicePortName]*renderedPort{}
	for n, sp := range next {
		if r := p.rendered[n]; r != nil && r.sp == sp {
			nextRendered[n] = r
		} else {
			nextRendered[n] = render(sp, p.families, p.masq)
		}
	}

	var txns []transaction
	for _, fam := range p.families {
		var saved map[string]*savedTable
		if full || !p.checked[fam] {
			var err error
			if saved, err = p.save(fam); err != nil {
				return err
			}
		}
		for _, table := range tables {
			fwd := p.input(fam, table, nextRendered, p.rendered, changed)
			prev := p.rendered
			back := func() []byte { return p.input(fam, table, prev, nextRendered, changed).render() }
			if saved != nil {
				fwd.jumps = missingJumps(table, saved[table])
				if full && table == tableNAT {
					fwd.remove = mergeNames(fwd.remove, staleChains(saved[table], fwd.ports))
				}
			}
			txns = append(txns, transaction{fam: fam, table: table, forward: fwd.render(), back: back})
		}
	}

	for i, t := range txns {
		if err := p.restore(t.fam, t.forward); err != nil {
			err = fmt.Errorf("write the %s %s table: %w", t.fam, t.table, err)
			for j := i - 1; j >= 0; j-- {
				if undoErr := p.restore(txns[j].fam, txns[j].back()); undoErr != nil {
					err = errors.Join(err, fmt.Errorf("undo the %s %s table (it now holds the new rules of %d ServicePorts): %w",
						txns[j].fam, txns[j].table, len(changed), undoErr))
				}
			}
			p.dirty = true
			return err
		}
	}

	var removed []dataplane.RemovedBackend
	for _, n := range changed {
		removed = append(removed, dataplane.RemovedUDPBackends(p.programmed[n], next[n])...)
	}
	p.programmed, p.rendered = next, nextRendered
	if full {
		p.dirty = false
	}
	for _, fam := range p.families {
		p.checked[fam] = true
	}
	DeleteRemovedUDP(p.conntrack, removed, p.log)
	return nil
}

func render(sp *dataplane.ServicePort, families []Family, masq Masquerade) *renderedPort {
	r := &renderedPort{sp: sp, rules: map[Family]*portRules{}}
	for _, fam := range families {
		pr := renderPort(sp, fam, masq)
		r.rules[fam] = &pr
	}
	return r
}

// input is the transaction that writes state for fam and table, rewriting
// the chains of changed and deleting those of their chains that other (the
// state being left) had and state does not.
func (p *Plane) input(fam Family, table string, state, other map[dataplane.ServicePortName]*renderedPort, changed []dataplane.ServicePortName) tableInput {
	in := tableInput{fam: fam, table: table}
	names := make([]dataplane.ServicePortName, 0, len(state))
	for n := range state {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	for _, n := range names {
		in.ports = append(in.ports, state[n].rules[fam])
	}
	if table != tableNAT {
		return in
	}
	for _, n := range changed {
		var keep []string
		if r := state[n]; r != nil {
			in.rewrite = append(in.rewrite, r.rules[fam])
			keep = r.rules[fam].chainNames()
		}
		if r := other[n]; r != nil {
			for _, c := range r.rules[fam].chainNames() {
				if !slices.Contains(keep, c) {
					in.remove = append(in.remove, c)
				}
			}
		}
	}
	return in
}

func mergeNames(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

func compareNames(a, b dataplane.ServicePortName) int {
	switch {
	case a.String() < b.String():
		return -1
	case a.String() > b.String():
		return 1
	}
	return 0
}

func (p *Plane) save(fam Family) (map[string]*savedTable, error) {
	out := map[string]*savedTable{}
	for _, table := range tables {
		text, err := p.run.Run(p.tools[fam].Save, []string{"-t", table}, nil)
		if err != nil {
			return nil, fmt.Errorf("read the %s %s table: %w", fam, table, err)
		}
		parsed, err := parseSave(text)
		if err != nil {
			return nil, fmt.Errorf("read the %s %s table: %w", fam, table, err)
		}
		// A table the kernel has not created yet saves as nothing.
		out[table] = parsed[table]
	}
	return out, nil
}

func (p *Plane) restore(fam Family, input []byte) error {
	_, err := p.run.Run(p.tools[fam].Restore, []string{"--noflush"}, input)
	return err
}
