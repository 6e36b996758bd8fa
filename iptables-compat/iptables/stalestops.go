package iptables

import (
	"maps"
	"slices"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// staleStopsName is the key the filter rules found in the kernel but
// not rendered go under in a family's kept rules. No ServicePort has the
// empty name, so it cannot collide with one.
var staleStopsName = dataplane.ServicePortName{}

// stopChains are the filter chains whose rules stop a Service's packets
// (see writeSteps), with the field of portRules that holds each.
var stopChains = []struct {
	name  string
	lines func(r *portRules) *[]string
}{
	{chainServices, func(r *portRules) *[]string { return &r.filterServices }},
	{chainExternalServices, func(r *portRules) *[]string { return &r.filterExternal }},
	{chainProxyFirewall, func(r *portRules) *[]string { return &r.filterFirewall }},
}

// withStaleStops adds to kept the stop rules the kernel's filter table
// holds and kept lacks, and their key to changed, for the writes of one
// family that read the tables first. The first write after a restart
// has no previous rendering to keep rules from: a Service that gained
// its first endpoint while kpr was down still has the old process's
// REJECT, and no DNAT yet. Written from next alone, the first filter
// restore would drop the REJECT before the nat restore adds the DNAT,
// and connects in between leave untranslated. Kept like the rules of a
// changed ServicePort, the REJECT goes only with the second filter
// write, once the nat table translates the Service. kept and changed
// are returned as they are when the kernel holds nothing more.
func withStaleStops(kept map[dataplane.ServicePortName]*renderedPort, changed []dataplane.ServicePortName,
	fam netfilter.Family, filter *netfilter.SavedTable) (map[dataplane.ServicePortName]*renderedPort, []dataplane.ServicePortName) {
	stale := &portRules{}
	found := false
	for _, c := range stopChains {
		saved := filter.ChainRules(c.name)
		if len(saved) == 0 {
			continue
		}
		rendered := map[string]bool{}
		for _, r := range kept {
			if rules := r.rulesOf(fam); rules != nil {
				for _, l := range *c.lines(rules) {
					if words, err := netfilter.SplitWords(l); err == nil {
						rendered[fingerprint(words)] = true
					}
				}
			}
		}
		for _, rule := range saved {
			if !rendered[fingerprint(rule)] {
				*c.lines(stale) = append(*c.lines(stale), netfilter.JoinWords(rule))
				found = true
			}
		}
	}
	if !found {
		return kept, changed
	}
	withStale := maps.Clone(kept)
	withStale[staleStopsName] = &renderedPort{rules: map[netfilter.Family]*portRules{fam: stale}}
	return withStale, append(slices.Clone(changed), staleStopsName)
}
