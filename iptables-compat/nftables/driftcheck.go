package nftables

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
)

var _ dataplane.DriftChecker = (*Plane)(nil)

// chainsPerStep bounds the chains whose rules one Step counts: a step
// runs on the sync loop, between two Apply calls, and at 10,000 Services
// the table holds 110,000 chains. A chain's dump takes about 150 µs on
// Linux 6.18 (BenchmarkDriftCheck), so a step about 75 ms.
const chainsPerStep = 500

// StartDriftCheck begins a check of kpr's table against what the Plane
// wrote, one read a Step: the ruleset's generation; the names of the
// table's chains, sets and maps; the elements of each shared map; how
// many rules each chain holds, a window of chains at a time. Each Step
// reads and compares with what the Plane holds at that moment, so Apply
// calls between the Steps do not spoil it. nft does not print rules back
// as they were written (knftables reads no rule text), so a rule changed
// in place is not seen; a rule added or removed, an element or an object
// changed, is, and the Reconcile it calls for rewrites the whole table.
//
// The generation settles most checks in one read: where nothing but the
// Plane has committed to nftables in the namespace since the table was
// last known to be as written, it still is.
func (p *Plane) StartDriftCheck() dataplane.DriftCheck {
	c := &driftCheck{p: p, dirty: p.dirty, writesAtStart: p.writes}
	if p.reader != nil {
		c.todo = append(c.todo, c.generation)
	}
	c.todo = append(c.todo, c.objects)
	for _, m := range sharedMaps(p.families) {
		c.todo = append(c.todo, func() (bool, error) { return c.elements("map", m.Name) })
	}
	for _, s := range sharedSets(p.families) {
		c.todo = append(c.todo, func() (bool, error) { return c.elements("set", s.Name) })
	}
	c.todo = append(c.todo, c.baseRuleCounts)
	c.names = make([]dataplane.ServicePortName, 0, len(p.rendered))
	for n := range p.rendered {
		c.names = append(c.names, n)
	}
	slices.SortFunc(c.names, dataplane.ServicePortName.Compare)
	c.todo = append(c.todo, c.ownedRuleCounts)
	return c
}

type driftCheck struct {
	p     *Plane
	dirty bool
	todo  []func() (bool, error)
	// names are the ServicePorts whose chains are still to be counted.
	names []dataplane.ServicePortName
	// startGen is the generation the check began at (known when
	// genKnown), and writesAtStart the Plane's writes then.
	startGen      uint32
	genKnown      bool
	writesAtStart int
	// skip is set when the generation settled the check.
	skip bool
	// exp is the expected table as of the Plane's expWrites-th write.
	exp       *expected
	expWrites int
}

func (c *driftCheck) Step() (done, held bool, err error) {
	if c.dirty || c.p.dirty || !c.p.written {
		// A failed call, or a Plane that has not written yet: only a
		// Reconcile vouches for the table.
		return true, false, nil
	}
	if len(c.todo) == 0 {
		return true, true, nil
	}
	step := c.todo[0]
	c.todo = c.todo[1:]
	held, err = step()
	if err != nil || !held {
		return true, false, err
	}
	if c.skip || len(c.todo) == 0 {
		c.verified()
		return true, true, nil
	}
	return false, true, nil
}

// generation ends the check where the ruleset has not moved since the
// Plane last knew its table to be as written.
func (c *driftCheck) generation() (bool, error) {
	gen, err := c.p.reader.generation()
	if err != nil {
		// The check goes on without it, by reading the table.
		return true, nil
	}
	c.startGen, c.genKnown = gen, true
	c.skip = c.p.verifiedGen.known && c.p.verifiedGen.gen == gen
	return true, nil
}

// verified records the generation at which a check that held found the
// table as written: only where every commit since the check began was
// one of the Plane's own writes, which it knows the effect of.
func (c *driftCheck) verified() {
	if c.skip || !c.genKnown { // genKnown: the reader gave a generation
		return
	}
	gen, err := c.p.reader.generation()
	if err != nil {
		return
	}
	if gen == c.startGen+uint32(c.p.writes-c.writesAtStart) {
		c.p.verifiedGen = knownGen{gen: gen, known: true}
	}
}

// expected is the table as the Plane wrote it.
type expected struct {
	chains   map[string]int // rules per chain
	sets     []string
	maps     []string
	elements map[string]map[string]string // map or hairpin set → key → verdict ("" in a set)
}

func (p *Plane) expected() expected {
	e := expected{chains: map[string]int{}, elements: map[string]map[string]string{}}
	for _, c := range baseChains(p.families) {
		e.chains[c.name] = len(c.rules)
	}
	for _, m := range sharedMaps(p.families) {
		e.maps = append(e.maps, m.Name)
		e.elements[m.Name] = map[string]string{}
	}
	for _, s := range sharedSets(p.families) {
		e.sets = append(e.sets, s.Name)
		e.elements[s.Name] = p.hairpin.byKey(s.Name)
	}
	chains, sets, elements := p.ownedObjects(p.rendered)
	for _, c := range chains {
		e.chains[c.name] = len(c.rules)
	}
	for _, s := range sets {
		e.sets = append(e.sets, s.name)
	}
	for _, el := range elements {
		e.elements[el.m][strings.Join(el.key, " . ")] = el.value
	}
	return e
}

func sameNames(got, want []string) bool {
	got, want = slices.Clone(got), slices.Clone(want)
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(slices.Compact(got), slices.Compact(want))
}

func (c *driftCheck) objects() (bool, error) {
	e := c.expected()
	if c.p.reader != nil {
		return c.objectCounts(e)
	}
	present, err := listTable(context.Background(), c.p.nft)
	if err != nil {
		return false, err
	}
	var chains []string
	for n := range e.chains {
		chains = append(chains, n)
	}
	return sameNames(present.chains, chains) && sameNames(present.sets, e.sets) && sameNames(present.maps, e.maps), nil
}

// objectCounts compares the names of the table's sets and maps with the
// rendering, and the number of its chains: the kernel's count of the
// table's objects less its named sets and maps (an anonymous one belongs
// to its rule and is not counted). Listing 110,000 chains over netlink
// takes seconds, and the rule counts that follow find a chain that is
// missing (it holds no rules), so a count finds one too many.
func (c *driftCheck) objectCounts(e expected) (bool, error) {
	ctx := context.Background()
	var sets, maps []string
	for _, l := range []struct {
		typ string
		to  *[]string
	}{{"set", &sets}, {"map", &maps}} {
		names, err := c.p.nft.List(ctx, l.typ)
		if isNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("list the %ss of the nftables table %s %s: %w", l.typ, Family, TableName, err)
		}
		*l.to = named(names)
	}
	objects, ok, err := c.p.reader.tableObjects()
	if err != nil || !ok {
		return false, err
	}
	chains := int(objects) - len(sets) - len(maps)
	return chains == len(e.chains) && sameNames(sets, e.sets) && sameNames(maps, e.maps), nil
}

// expected is the Plane's expected table, computed again only after the
// Plane has written.
func (c *driftCheck) expected() expected {
	if c.exp == nil || c.expWrites != c.p.writes {
		e := c.p.expected()
		c.exp, c.expWrites = &e, c.p.writes
	}
	return *c.exp
}

func (c *driftCheck) elements(kind, m string) (bool, error) {
	els, err := c.p.nft.ListElements(context.Background(), kind, m)
	if err != nil {
		return false, fmt.Errorf("list the elements of %s %s: %w", kind, m, err)
	}
	want := c.expected().elements[m]
	if len(els) != len(want) {
		return false, nil
	}
	for _, el := range els {
		if v, ok := want[normalKey(el.Key)]; !ok || v != strings.Join(el.Value, " ") {
			return false, nil
		}
	}
	return true, nil
}

// normalKey joins an element's key as the Plane writes it: nft lists a
// protocol by name and a port as a number, as kpr writes them.
func normalKey(key []string) string { return strings.Join(key, " . ") }

// baseRuleCounts compares the rules of the shared chains, which every
// packet passes, with the rendering.
func (c *driftCheck) baseRuleCounts() (bool, error) {
	want := map[string]int{}
	for _, ch := range baseChains(c.p.families) {
		want[ch.name] = len(ch.rules)
	}
	return c.p.rulesAsWritten(want)
}

// ownedRuleCounts compares the rules of the chains of the next
// ServicePorts, up to chainsPerStep chains, with what the Plane holds for
// them now; it queues itself again while ServicePorts are left. A
// ServicePort written after the check began is not counted: the Plane
// has just written its chains whole.
func (c *driftCheck) ownedRuleCounts() (bool, error) {
	want := map[string]int{}
	for len(c.names) > 0 && len(want) < chainsPerStep {
		r := c.p.rendered[c.names[0]]
		c.names = c.names[1:]
		for _, fam := range c.p.families {
			for _, ch := range r.rulesOf(fam).chains {
				want[ch.name] = len(ch.rules)
			}
		}
	}
	if len(c.names) > 0 {
		c.todo = append(c.todo, c.ownedRuleCounts)
	}
	if len(want) == 0 {
		return true, nil
	}
	return c.p.rulesAsWritten(want)
}

// rulesAsWritten tells whether each chain of want holds as many rules as
// want says.
func (p *Plane) rulesAsWritten(want map[string]int) (bool, error) {
	chains := make([]string, 0, len(want))
	for n := range want {
		chains = append(chains, n)
	}
	got, err := p.ruleCounts(chains)
	if err != nil {
		return false, fmt.Errorf("count the rules of the nftables table %s %s: %w", Family, TableName, err)
	}
	for n, w := range want {
		if got[n] != w {
			return false, nil
		}
	}
	return true, nil
}

// ruleCounts counts the rules of chains over netlink where the Plane has
// a kernelReader, and through knftables' ListRules (a knftables.Fake in
// tests) where it has not.
func (p *Plane) ruleCounts(chains []string) (map[string]int, error) {
	if p.reader != nil {
		return p.reader.ruleCounts(chains)
	}
	rules, err := p.nft.ListRules(context.Background(), "")
	if err != nil {
		return nil, err
	}
	got := map[string]int{}
	for _, r := range rules {
		got[r.Chain]++
	}
	return got, nil
}
