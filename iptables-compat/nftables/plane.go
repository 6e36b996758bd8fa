package nftables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"
	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/metrics"
)

// Options configure a Plane.
type Options struct {
	// NFT reaches kpr's table: knftables.New(Family, TableName) on a
	// node, a knftables.Fake in tests; required.
	NFT knftables.Interface
	// Families are the IP families the Plane serves; a family left out
	// gets no rules (its frontends are not served).
	Families []netfilter.Family
	// Conntrack deletes the UDP conntrack entries that no longer match
	// the rules (see netfilter.UDPConntrack); nil skips it.
	Conntrack netfilter.ConntrackCleaner
	// Masquerade is kube-proxy's --masquerade-all and --detect-local-mode.
	Masquerade netfilter.Masquerade
	// Metrics counts failed transactions, as kube-proxy's
	// sync_proxy_rules_nftables_sync_failures_total; nil counts nothing.
	Metrics metrics.NFTablesReporter
	Log     *zap.Logger
}

// Plane is the nftables dataplane.Dataplane.
type Plane struct {
	nft       knftables.Interface
	families  []netfilter.Family
	conntrack *netfilter.UDPConntrack
	cfg       config
	log       *zap.Logger
	metrics   metrics.NFTablesReporter

	// programmed is what the table holds as far as this Plane wrote it.
	programmed map[dataplane.ServicePortName]*dataplane.ServicePort
	// rendered caches the rules of each programmed ServicePort; a
	// ServicePort handed over never changes, so the pointer keys it.
	rendered map[dataplane.ServicePortName]*renderedPort
	// hairpin counts the rendered ServicePorts that hold each element of
	// the hairpin sets.
	hairpin hairpinRefs
	// written is set once the Plane has written the whole table: until
	// then a write rewrites it all, whatever an earlier process left.
	written bool
	// dirty is set by a failed call and cleared by a successful
	// Reconcile: until then no drift check vouches for the table.
	dirty bool

	// reader reads the kernel over netlink; nil over a knftables.Fake.
	reader kernelReader
	// writes counts the transactions the Plane has committed.
	writes int
	// verifiedGen is the ruleset generation at which the table was last
	// known to hold what the Plane wrote: after a full write, or a drift
	// check that held, with no commit of anyone else's in between, and
	// carried along by the Plane's own writes.
	verifiedGen knownGen
}

// knownGen is a ruleset generation, if known.
type knownGen struct {
	gen   uint32
	known bool
}

type renderedPort struct {
	sp    *dataplane.ServicePort
	rules map[netfilter.Family]*portRules
}

func (r *renderedPort) rulesOf(fam netfilter.Family) *portRules {
	if r == nil {
		return &portRules{}
	}
	return r.rules[fam]
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New returns a Plane; it reads and writes nothing until the first call.
func New(o Options) (*Plane, error) {
	if o.NFT == nil || len(o.Families) == 0 {
		return nil, errors.New("nftables.New: Options need NFT and at least one family")
	}
	p := &Plane{
		nft: o.NFT, families: slices.Clone(o.Families), log: o.Log, metrics: o.Metrics,
		cfg:        config{masq: o.Masquerade},
		programmed: map[dataplane.ServicePortName]*dataplane.ServicePort{},
		rendered:   map[dataplane.ServicePortName]*renderedPort{},
		hairpin:    hairpinRefs{},
	}
	slices.Sort(p.families)
	p.families = slices.Compact(p.families)
	if p.log == nil {
		p.log = zap.NewNop()
	}
	p.reader, _ = o.NFT.(kernelReader)
	p.conntrack = netfilter.NewUDPConntrack(o.Conntrack, p.families, p.log)
	return p, nil
}

// Apply writes the changed ServicePorts' chains, sets and map elements in
// one transaction; everything else in the table is left as it is.
func (p *Plane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	next, changed := dataplane.AfterApply(p.programmed, changes)
	if len(changed) == 0 {
		return nil
	}
	return p.write(next, changed, false)
}

// Reconcile rewrites the whole table from all in one transaction and
// deletes every chain, set and map of the table it does not render,
// whoever left them.
func (p *Plane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	next, changed := dataplane.AfterReconcile(p.programmed, all)
	return p.write(next, changed, true)
}

// write brings the table from p.programmed to next in one transaction,
// so that a packet meets either the old rules or the new, never a
// ServicePort half-written, and a failed call leaves the table as it was.
func (p *Plane) write(next map[dataplane.ServicePortName]*dataplane.ServicePort, changed []dataplane.ServicePortName, full bool) error {
	slices.SortFunc(changed, dataplane.ServicePortName.Compare)
	nextRendered := make(map[dataplane.ServicePortName]*renderedPort, len(next))
	for n, sp := range next {
		if r := p.rendered[n]; r != nil && r.sp == sp {
			nextRendered[n] = r
		} else {
			nextRendered[n] = render(sp, p.families, p.cfg)
		}
	}
	whole := full || !p.written
	// A whole write counts the hairpin elements afresh (hairpinAfter); a
	// partial one counts only the change its ServicePorts make to
	// p.hairpin (hairpinDelta).
	hairpinAfter, hairpinDelta := hairpinRefs{}, hairpinRefs{}
	if whole {
		for _, r := range nextRendered {
			hairpinAfter.count(r, 1)
		}
	} else {
		for _, n := range changed {
			hairpinDelta.count(p.rendered[n], -1)
			hairpinDelta.count(nextRendered[n], 1)
		}
	}
	ctx := context.Background()
	tx := p.nft.NewTransaction()
	before := p.generation()
	if whole {
		present, err := listTable(ctx, p.nft)
		if err != nil {
			p.dirty = true
			return err
		}
		found, err := udpFrontendsInTable(ctx, p.nft, present)
		if err != nil {
			// Only the conntrack cleanup of Services deleted while kpr
			// was away misses them; the write goes on.
			p.log.Warn("Could not read the UDP frontends of the nftables table", zap.Error(err))
		}
		p.conntrack.FoundInKernel(found)
		p.fullWrite(tx, nextRendered, present, hairpinAfter)
	} else {
		p.partialWrite(tx, p.rendered, nextRendered, changed)
		writeHairpinChanges(tx, p.hairpin, hairpinDelta)
	}
	if tx.NumOperations() > 0 {
		if err := p.nft.Run(ctx, tx); err != nil {
			p.dirty = true
			for _, fam := range p.families {
				if p.metrics != nil {
					p.metrics.SyncFailed(fam)
				}
			}
			return fmt.Errorf("write the nftables table %s %s: %w", Family, TableName, err)
		}
		p.writes++
		p.carryVerifiedGen(before, whole)
	}
	if whole {
		p.hairpin = hairpinAfter
	} else {
		p.hairpin.apply(hairpinDelta)
	}

	old := p.programmed
	p.programmed, p.rendered = next, nextRendered
	if full {
		p.dirty = false
	}
	p.written = true
	p.conntrack.Synced(old, next, changed, full)
	return nil
}

// generation is the ruleset's generation, unknown where the Plane has no
// kernelReader or the read fails.
func (p *Plane) generation() knownGen {
	if p.reader == nil {
		return knownGen{}
	}
	gen, err := p.reader.generation()
	if err != nil {
		return knownGen{}
	}
	return knownGen{gen: gen, known: true}
}

// carryVerifiedGen moves verifiedGen past the transaction just committed,
// which began at generation before: where the kernel counts exactly
// that one commit since, the table holds what the Plane wrote if it did
// before the commit, or if the commit rewrote the whole table.
func (p *Plane) carryVerifiedGen(before knownGen, whole bool) {
	after := p.generation()
	ours := before.known && after.known && after.gen == before.gen+1
	if ours && (whole || p.verifiedGen == before) {
		p.verifiedGen = after
	} else {
		p.verifiedGen = knownGen{}
	}
}

func render(sp *dataplane.ServicePort, families []netfilter.Family, cfg config) *renderedPort {
	r := &renderedPort{sp: sp, rules: map[netfilter.Family]*portRules{}}
	for _, fam := range families {
		r.rules[fam] = renderPort(sp, fam, cfg)
	}
	return r
}

// tableObjects are the names of the chains, sets and maps a table holds.
type tableObjects struct {
	chains, sets, maps []string
}

// byKind is the set of "chain NAME", "set NAME" and "map NAME" the table
// holds.
func (t tableObjects) byKind() map[string]bool {
	out := make(map[string]bool, len(t.chains)+len(t.sets)+len(t.maps))
	for _, l := range []struct {
		kind  string
		names []string
	}{{"chain", t.chains}, {"set", t.sets}, {"map", t.maps}} {
		for _, n := range l.names {
			out[l.kind+" "+n] = true
		}
	}
	return out
}

// listTable reads which objects kpr's table holds; none when it does not
// exist yet.
func listTable(ctx context.Context, nft knftables.Interface) (tableObjects, error) {
	var out tableObjects
	for _, l := range []struct {
		typ string
		to  *[]string
	}{{"chain", &out.chains}, {"set", &out.sets}, {"map", &out.maps}} {
		names, err := nft.List(ctx, l.typ)
		if err != nil && !isNotFound(err) {
			return out, fmt.Errorf("list the %ss of the nftables table %s %s: %w", l.typ, Family, TableName, err)
		}
		*l.to = named(names)
	}
	return out, nil
}

// named drops the anonymous sets and maps from a netlink listing, which
// names those nft makes for a rule's { ... } literals; they go with their
// rule.
func named(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !strings.HasPrefix(n, "__") {
			out = append(out, n)
		}
	}
	return out
}

// ownedObjects are what the rendered ServicePorts own, in name order, so
// that every full write is the same transaction.
func (p *Plane) ownedObjects(rendered map[dataplane.ServicePortName]*renderedPort) (chains []chain, sets []famSet, elements []element) {
	names := make([]dataplane.ServicePortName, 0, len(rendered))
	for n := range rendered {
		names = append(names, n)
	}
	slices.SortFunc(names, dataplane.ServicePortName.Compare)
	for _, n := range names {
		for _, fam := range p.families {
			r := rendered[n].rules[fam]
			chains = append(chains, r.chains...)
			for _, s := range r.sets {
				sets = append(sets, famSet{s, fam})
			}
			elements = append(elements, r.elements...)
		}
	}
	return chains, sets, elements
}

type famSet struct {
	affinity
	fam netfilter.Family
}

// fullWrite writes the whole table: every shared object flushed and
// rewritten, every owned chain rewritten, and every object the table
// holds (present) that the rendering does not have deleted. Only what
// the table already holds is flushed: a flush costs nft as much as the
// chain's rules, and a cold start would otherwise flush 110,000 new,
// empty chains at 10,000 Services.
func (p *Plane) fullWrite(tx *knftables.Transaction, rendered map[dataplane.ServicePortName]*renderedPort, present tableObjects, hairpin hairpinRefs) {
	base := baseChains(p.families)
	maps := sharedMaps(p.families)
	chains, sets, elements := p.ownedObjects(rendered)

	tx.Add(&knftables.Table{})
	had := present.byKind()
	want := map[string]bool{}
	flushIfPresent := func(kind, name string, obj knftables.Object) {
		if had[kind+" "+name] {
			tx.Flush(obj)
		}
	}
	for _, m := range maps {
		tx.Add(m)
		flushIfPresent("map", m.Name, m)
		want["map "+m.Name] = true
	}
	for _, s := range sharedSets(p.families) {
		tx.Add(s)
		flushIfPresent("set", s.Name, s)
		want["set "+s.Name] = true
	}
	for _, s := range sets {
		tx.Add(s.object(s.fam))
		want["set "+s.name] = true
	}
	for _, c := range base {
		tx.Add(c.object())
		flushIfPresent("chain", c.name, &knftables.Chain{Name: c.name})
		want["chain "+c.name] = true
	}
	for _, c := range chains {
		tx.Add(&knftables.Chain{Name: c.name})
		flushIfPresent("chain", c.name, &knftables.Chain{Name: c.name})
		want["chain "+c.name] = true
	}
	var staleChains []string
	for _, c := range present.chains {
		if !want["chain "+c] {
			staleChains = append(staleChains, c)
			tx.Flush(&knftables.Chain{Name: c})
		}
	}
	for _, c := range base {
		addRules(tx, c.name, c.rules)
	}
	for _, c := range chains {
		addRules(tx, c.name, c.rules)
	}
	for _, e := range elements {
		tx.Add(e.object())
	}
	for _, e := range hairpin.elements() {
		tx.Add(e.object())
	}
	for _, c := range staleChains {
		tx.Delete(&knftables.Chain{Name: c})
	}
	for _, s := range present.sets {
		if !want["set "+s] {
			tx.Delete(&knftables.Set{Name: s})
		}
	}
	for _, m := range present.maps {
		if !want["map "+m] {
			tx.Delete(&knftables.Map{Name: m})
		}
	}
}

func addRules(tx *knftables.Transaction, chainName string, rules []string) {
	for _, r := range rules {
		tx.Add(&knftables.Rule{Chain: chainName, Rule: r})
	}
}

func (e element) object() *knftables.Element {
	if e.value == "" {
		return &knftables.Element{Set: e.m, Key: e.key}
	}
	return &knftables.Element{Map: e.m, Key: e.key, Value: []string{e.value}}
}

// partialWrite writes what differs between the renderings before and
// now of the changed ServicePorts: their new sets and chains, their
// changed chains rewritten, their map elements, and the chains and sets
// they no longer own deleted. The shared chains are not touched.
func (p *Plane) partialWrite(tx *knftables.Transaction, before, now map[dataplane.ServicePortName]*renderedPort, changed []dataplane.ServicePortName) {
	var addSets []famSet
	var newChains, rewrite []chain
	var existing []string
	var delElems, addElems []element
	var goneChains, goneSets []string
	for _, n := range changed {
		for _, fam := range p.families {
			old, cur := before[n].rulesOf(fam), now[n].rulesOf(fam)
			oldChains := map[string][]string{}
			for _, c := range old.chains {
				oldChains[c.name] = c.rules
			}
			curChains := map[string]bool{}
			for _, c := range cur.chains {
				curChains[c.name] = true
				rules, had := oldChains[c.name]
				switch {
				case !had:
					newChains = append(newChains, c)
					rewrite = append(rewrite, c)
				case !slices.Equal(rules, c.rules):
					existing = append(existing, c.name)
					rewrite = append(rewrite, c)
				}
			}
			for _, c := range old.chains {
				if !curChains[c.name] {
					goneChains = append(goneChains, c.name)
				}
			}
			for _, s := range cur.sets {
				if !slices.Contains(old.sets, s) {
					addSets = append(addSets, famSet{s, fam})
				}
			}
			for _, s := range old.sets {
				if !slices.Contains(cur.sets, s) {
					goneSets = append(goneSets, s.name)
				}
			}
			oldElems := map[string]element{}
			for _, e := range old.elements {
				oldElems[e.id()] = e
			}
			curElems := map[string]bool{}
			for _, e := range cur.elements {
				curElems[e.id()] = true
				if was, ok := oldElems[e.id()]; !ok || was.value != e.value {
					if ok {
						delElems = append(delElems, was)
					}
					addElems = append(addElems, e)
				}
			}
			for _, e := range old.elements {
				if !curElems[e.id()] {
					delElems = append(delElems, e)
				}
			}
		}
	}
	// Objects before what refers to them; elements deleted before the
	// same key is added for another ServicePort; chains flushed before
	// any is deleted, since one may jump to another.
	for _, s := range addSets {
		tx.Add(s.object(s.fam))
	}
	for _, c := range newChains {
		tx.Add(&knftables.Chain{Name: c.name})
	}
	for _, c := range existing {
		tx.Flush(&knftables.Chain{Name: c})
	}
	for _, c := range rewrite {
		addRules(tx, c.name, c.rules)
	}
	for _, e := range delElems {
		tx.Delete(e.object())
	}
	for _, e := range addElems {
		tx.Add(e.object())
	}
	for _, c := range goneChains {
		tx.Flush(&knftables.Chain{Name: c})
	}
	for _, c := range goneChains {
		tx.Delete(&knftables.Chain{Name: c})
	}
	for _, s := range goneSets {
		tx.Delete(&knftables.Set{Name: s})
	}
}
