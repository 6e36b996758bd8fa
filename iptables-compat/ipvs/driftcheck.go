package ipvs

import (
	"maps"
	"slices"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

var _ dataplane.DriftChecker = (*Plane)(nil)

// driftCheck runs its steps one a call; each reads one part of the kernel.
type driftCheck struct {
	p     *Plane
	steps []func() (bool, error)
	// read is what the first step read, for the next to judge ownership.
	read *kstate
}

// StartDriftCheck begins a check of the kernel against what the Plane
// wrote, in steps: the addresses and sets, the virtual servers, then each
// family's tables. So the periodic sync rewrites only when something
// changed the kernel behind kpr's back.
func (p *Plane) StartDriftCheck() dataplane.DriftCheck {
	c := &driftCheck{p: p}
	c.steps = append(c.steps, c.addrsAndSets, c.services)
	for _, fam := range p.families {
		for _, table := range tables {
			c.steps = append(c.steps, func() (bool, error) { return c.rules(fam, table) })
		}
	}
	return c
}

func (c *driftCheck) Step() (done, held bool, err error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if !c.p.reconciled || c.p.cur == nil {
		return true, false, nil // only a Reconcile vouches for the kernel
	}
	if len(c.steps) == 0 {
		return true, true, nil
	}
	step := c.steps[0]
	c.steps = c.steps[1:]
	ok, err := step()
	if err != nil || !ok {
		return true, false, err
	}
	return len(c.steps) == 0, true, nil
}

func (c *driftCheck) addrsAndSets() (bool, error) {
	t := newKState()
	addrs, err := c.p.k.DeviceAddrs()
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		t.bound[a.Unmap()] = true
	}
	for _, s := range setSpecs() {
		if s.IPv6 && !c.p.ipv6() {
			continue
		}
		entries, ok, err := c.p.k.SetEntries(s.Name)
		if err != nil || !ok {
			return false, err
		}
		for _, e := range entries {
			t.entries[setEntry{s.Name, e}] = true
		}
	}
	c.read = t
	return maps.Equal(t.bound, c.p.cur.bound) && maps.Equal(t.entries, c.p.cur.entries), nil
}

func (c *driftCheck) services() (bool, error) {
	svcs, err := c.p.k.Services()
	if err != nil {
		return false, err
	}
	n := 0
	for k, s := range svcs {
		if !owned(k, c.read) && c.p.cur.services[k] == nil {
			continue
		}
		n++
		have := c.p.cur.services[k]
		if have == nil || have.Service != s.Service || !sameWeights(have.Dests, s.Dests) {
			return false, nil
		}
	}
	return n == len(c.p.cur.services), nil
}

// sameWeights compares real servers and weights, not connection counts.
func sameWeights(a, b map[dataplane.Backend]Dest) bool {
	if len(a) != len(b) {
		return false
	}
	for k, d := range a {
		if e, ok := b[k]; !ok || e.Weight != d.Weight {
			return false
		}
	}
	return true
}

func (c *driftCheck) rules(fam netfilter.Family, table string) (bool, error) {
	saved, err := c.p.save(fam, table)
	if err != nil {
		return false, err
	}
	if len(netfilter.MissingJumps(table, baseJumps, saved)) > 0 {
		return false, nil
	}
	want := c.p.ruleSet(fam, c.p.cur.internal).rules(table)
	for _, chain := range chainsOf(table) {
		if !saved.HasChain(chain) {
			return false, nil
		}
		var w []string
		for _, r := range want {
			if len(r) > len(chain)+4 && r[:len(chain)+4] == "-A "+chain+" " {
				w = append(w, r)
			}
		}
		if !slices.Equal(savedRules(saved, chain), w) {
			return false, nil
		}
	}
	return true, nil
}
