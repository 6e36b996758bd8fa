package nftables

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
)

var _ dataplane.DriftChecker = (*Plane)(nil)

// StartDriftCheck begins a check of kpr's table against what the Plane
// wrote, one read a Step: the names of its chains, sets and maps; the
// elements of each map; how many rules each chain holds. Each Step reads
// and compares with what the Plane holds at that moment, so Apply calls
// between the Steps do not spoil it. nft does not print rules back as
// they were written (knftables reads no rule text), so a rule changed in
// place is not seen; a rule added or removed, an element or an object
// changed, is, and the Reconcile it calls for rewrites the whole table.
func (p *Plane) StartDriftCheck() dataplane.DriftCheck {
	c := &driftCheck{p: p, dirty: p.dirty}
	c.todo = append(c.todo, c.objects)
	for _, m := range sharedMaps(p.families) {
		c.todo = append(c.todo, func() (bool, error) { return c.elements(m.Name) })
	}
	c.todo = append(c.todo, c.ruleCounts)
	return c
}

type driftCheck struct {
	p     *Plane
	dirty bool
	todo  []func() (bool, error)
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
	return len(c.todo) == 0, true, nil
}

// expected is the table as the Plane wrote it.
type expected struct {
	chains   map[string]int // rules per chain
	sets     []string
	maps     []string
	elements map[string]map[string]string // map → key → verdict
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
	present, err := listTable(context.Background(), c.p.nft)
	if err != nil {
		return false, err
	}
	e := c.p.expected()
	var chains []string
	for n := range e.chains {
		chains = append(chains, n)
	}
	return sameNames(present.chains, chains) && sameNames(present.sets, e.sets) && sameNames(present.maps, e.maps), nil
}

func (c *driftCheck) elements(m string) (bool, error) {
	els, err := c.p.nft.ListElements(context.Background(), "map", m)
	if err != nil {
		return false, fmt.Errorf("list the elements of map %s: %w", m, err)
	}
	want := c.p.expected().elements[m]
	if len(els) != len(want) {
		return false, nil
	}
	for _, el := range els {
		if v, ok := want[normalKey(el.Key)]; !ok || len(el.Value) != 1 || v != el.Value[0] {
			return false, nil
		}
	}
	return true, nil
}

// normalKey joins an element's key as the Plane writes it: nft lists a
// protocol by name and a port as a number, as kpr writes them.
func normalKey(key []string) string { return strings.Join(key, " . ") }

func (c *driftCheck) ruleCounts() (bool, error) {
	rules, err := c.p.nft.ListRules(context.Background(), "")
	if err != nil {
		return false, fmt.Errorf("list the rules of the nftables table %s %s: %w", Family, TableName, err)
	}
	got := map[string]int{}
	for _, r := range rules {
		got[r.Chain]++
	}
	want := c.p.expected().chains
	for name, n := range want {
		if got[name] != n {
			return false, nil
		}
	}
	return len(got) <= len(want), nil
}
