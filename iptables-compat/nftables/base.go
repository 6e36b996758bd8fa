package nftables

import (
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// baseChain is one chain every sync of the table holds whatever the
// Services: the hooked chains and those the maps are looked up from.
type baseChain struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
	rules    []string
}

func (c baseChain) object() *knftables.Chain {
	ch := &knftables.Chain{Name: c.name}
	if c.hook != "" {
		ch.Type, ch.Hook, ch.Priority = knftables.PtrTo(c.typ), knftables.PtrTo(c.hook), knftables.PtrTo(c.priority)
	}
	return ch
}

// lookup is the rule that looks a packet's destination up in fam's map
// base.
func lookup(fam netfilter.Family, base string) string {
	return addrWord(fam) + " daddr . meta l4proto . th dport vmap @" + mapOf(base, fam)
}

// baseChains are the shared chains for families, as kube-proxy's
// nftables mode hooks them: the firewall before DNAT, the Service
// dispatch at dstnat in prerouting and output, the no-endpoint checks
// after DNAT (a packet that was DNATed no longer has the frontend's
// address, so only a packet no rule translated is rejected or dropped),
// masquerading at srcnat.
func baseChains(families []netfilter.Family) []baseChain {
	each := func(base string) []string {
		var out []string
		for _, fam := range families {
			out = append(out, lookup(fam, base))
		}
		return out
	}
	const afterDNAT = knftables.FilterPriority + "-10"
	const beforeDNAT = knftables.DNATPriority + "-10"
	return []baseChain{
		{name: chainFilterPreDNAT, typ: knftables.FilterType, hook: knftables.PreroutingHook, priority: beforeDNAT,
			rules: []string{"jump " + chainFirewallCheck}},
		{name: chainFilterOutPreDNAT, typ: knftables.FilterType, hook: knftables.OutputHook, priority: beforeDNAT,
			rules: []string{"jump " + chainFirewallCheck}},
		{name: chainNATPrerouting, typ: knftables.NATType, hook: knftables.PreroutingHook, priority: knftables.DNATPriority,
			rules: []string{"jump " + chainServices}},
		{name: chainNATOutput, typ: knftables.NATType, hook: knftables.OutputHook, priority: knftables.DNATPriority,
			rules: []string{"jump " + chainServices}},
		{name: chainNATPostrouting, typ: knftables.NATType, hook: knftables.PostroutingHook, priority: knftables.SNATPriority,
			rules: append(hairpinRules(families), "jump "+chainMasquerading)},
		{name: chainFilterInput, typ: knftables.FilterType, hook: knftables.InputHook, priority: afterDNAT,
			rules: []string{"ct state new jump " + chainEndpointsCheck, "ct state new jump " + chainExternalCheck}},
		{name: chainFilterForward, typ: knftables.FilterType, hook: knftables.ForwardHook, priority: afterDNAT,
			rules: []string{"ct state new jump " + chainEndpointsCheck, "ct state new jump " + chainExternalCheck}},
		// Traffic of the node itself meets no-local-endpoints never:
		// under a Local policy it is sent to every endpoint.
		{name: chainFilterOutput, typ: knftables.FilterType, hook: knftables.OutputHook, priority: afterDNAT,
			rules: []string{"ct state new jump " + chainEndpointsCheck}},
		{name: chainFirewallCheck, rules: each(mapFirewallIPs)},
		{name: chainServices, rules: each(mapServiceIPs)},
		{name: chainEndpointsCheck, rules: each(mapNoEndpoints)},
		{name: chainExternalCheck, rules: each(mapNoLocalEndpoints)},
		{name: chainReject, rules: []string{"reject"}},
		{name: chainMarkMasq, rules: []string{"meta mark set meta mark | " + masqMark}},
		{name: chainMasquerading, rules: []string{
			"meta mark & " + masqMark + " == 0 return",
			"meta mark set meta mark ^ " + masqMark,
			"masquerade fully-random",
		}},
	}
}

// hairpinRules mark for masquerading a connection DNATed to the endpoint
// it came from, whose endpoint the service chain DNATed to directly (an
// endpoint chain marks its own hairpin traffic).
func hairpinRules(families []netfilter.Family) []string {
	var out []string
	for _, fam := range families {
		w := addrWord(fam)
		out = append(out, "ct status dnat "+w+" saddr . "+w+" daddr . meta l4proto . th dport @"+mapOf(setHairpin, fam)+" jump "+chainMarkMasq)
	}
	return out
}

// sharedSets are the hairpin sets of families.
func sharedSets(families []netfilter.Family) []*knftables.Set {
	var out []*knftables.Set
	for _, fam := range families {
		out = append(out, &knftables.Set{Name: mapOf(setHairpin, fam), Type: addrType(fam) + " . " + addrType(fam) + " . inet_proto . inet_service"})
	}
	return out
}

// sharedMaps are the verdict maps of families.
func sharedMaps(families []netfilter.Family) []*knftables.Map {
	var out []*knftables.Map
	for _, fam := range families {
		for _, base := range []string{mapFirewallIPs, mapServiceIPs, mapNoEndpoints, mapNoLocalEndpoints} {
			out = append(out, &knftables.Map{Name: mapOf(base, fam), Type: addrType(fam) + " . inet_proto . inet_service : verdict"})
		}
	}
	return out
}

// setObject is the affinity set a as nftables holds it.
func (a affinity) object(fam netfilter.Family) *knftables.Set {
	return &knftables.Set{Name: a.name, Type: addrType(fam), Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: knftables.PtrTo(time.Duration(a.timeout) * time.Second)}
}
