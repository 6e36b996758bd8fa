package ipvs

import (
	"net/netip"
	"slices"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// observed reads what the kernel serves, as IPVS and netfilter would
// treat a new connection: a virtual server whose address is local (bound
// to the dummy interface, or one of localAddrs, the node's own) serves
// traffic from outside with its real servers of non-zero weight, and
// rejects (ICMP port unreachable) with none; the node's own traffic meets
// the fwmark virtual server its nat rule marks it for, if any, else the
// same one. Outside traffic to a frontend in the firewall set is dropped
// by filter unless its source is in the source-range set.
func observed(k Kernel, run netfilter.Runner, v netfilter.Variant, localAddrs map[netip.Addr]bool) (dataplanetest.State, error) {
	svcs, err := k.Services()
	if err != nil {
		return nil, err
	}
	addrs, err := k.DeviceAddrs()
	if err != nil {
		return nil, err
	}
	local := map[netip.Addr]bool{}
	for a := range localAddrs {
		local[a] = true
	}
	for _, a := range addrs {
		local[a.Unmap()] = true
	}
	sets := map[string][]Entry{}
	for _, s := range setSpecs() {
		entries, _, err := k.SetEntries(s.Name)
		if err != nil {
			return nil, err
		}
		sets[s.Name] = entries
	}
	internal := map[ServiceKey]uint32{}
	firewall := map[bool]bool{}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		tools := netfilter.ToolsFor(v, fam)
		nat, err := run.Run(tools.Save, []string{"-t", "nat"}, nil)
		if err != nil {
			return nil, err
		}
		natT, err := parseTable(nat, tableNAT)
		if err != nil {
			return nil, err
		}
		// The marks count only where the node's traffic reaches them.
		if natT.HasJump(jump(tableNAT, "OUTPUT", "", chainServices)) {
			for k, m := range parseInternal(natT) {
				internal[k] = m
			}
		}
		filter, err := run.Run(tools.Save, []string{"-t", "filter"}, nil)
		if err != nil {
			return nil, err
		}
		ft, err := parseTable(filter, tableFilter)
		if err != nil {
			return nil, err
		}
		want := ruleSet{fam: fam}.rules(tableFilter)[0]
		firewall[fam == netfilter.IPv6] = ft.HasJump(jump(tableFilter, "INPUT", "-m conntrack --ctstate NEW", chainFirewall)) &&
			slices.Contains(savedRules(ft, chainFirewall), want)
	}

	serving := func(s *ServiceState) dataplanetest.Serving {
		var out dataplanetest.Serving
		for b, d := range s.Dests {
			if d.Weight > 0 {
				out.Backends = append(out.Backends, b)
			}
		}
		out.AffinityTimeout = time.Duration(s.Timeout) * time.Second
		return out
	}
	state := dataplanetest.State{}
	for k, s := range svcs {
		if k.FWMark != 0 || !local[k.Addr] {
			continue
		}
		dk := dataplanetest.Key{Addr: k.Addr, Port: k.Port, Protocol: k.Proto}
		ext := serving(s)
		e := Entry{Addr: k.Addr, Proto: k.Proto, Port: k.Port}
		if firewall[k.IPv6] && slices.Contains(sets[setName(setFirewall, k.IPv6)], e) {
			for _, se := range sets[setName(setSourceCIDR, k.IPv6)] {
				if se.Addr == k.Addr && se.Port == k.Port && se.Proto == k.Proto {
					ext.SourceRanges = append(ext.SourceRanges, se.Net)
				}
			}
			if len(ext.SourceRanges) == 0 {
				ext.Backends = nil // every source is dropped
			}
		}
		dk.Traffic = dataplanetest.External
		state[dk] = ext
		in := serving(s)
		if m, ok := internal[k]; ok {
			if ms, ok := svcs[ServiceKey{IPv6: k.IPv6, FWMark: m}]; ok {
				in = serving(ms)
			}
		}
		dk.Traffic = dataplanetest.Internal
		state[dk] = in
	}
	return state, nil
}

// tamperer damages the kernel's state through the Kernel, as another
// program writing IPVS would.
type tamperer struct {
	k   Kernel
	run netfilter.Runner
	v   netfilter.Variant
}

// internalService is the virtual server that serves the node's own
// traffic to k.
func (tp tamperer) internalService(k ServiceKey) (ServiceKey, error) {
	tools := netfilter.ToolsFor(tp.v, netfilter.IPv4)
	if k.IPv6 {
		tools = netfilter.ToolsFor(tp.v, netfilter.IPv6)
	}
	nat, err := tp.run.Run(tools.Save, []string{"-t", "nat"}, nil)
	if err != nil {
		return ServiceKey{}, err
	}
	svcs, err := tp.k.Services()
	if err != nil {
		return ServiceKey{}, err
	}
	natT, err := parseTable(nat, tableNAT)
	if err != nil {
		return ServiceKey{}, err
	}
	if m, ok := parseInternal(natT)[k]; ok {
		if mk := (ServiceKey{IPv6: k.IPv6, FWMark: m}); svcs[mk] != nil {
			return mk, nil
		}
	}
	return k, nil
}

func (tp tamperer) Remove(dk dataplanetest.Key) error {
	k := addrKey(dk.Addr, dk.Protocol, dk.Port)
	ik, err := tp.internalService(k)
	if err != nil {
		return err
	}
	if ik != k {
		if err := tp.k.DelService(ik); err != nil {
			return err
		}
	}
	return tp.k.DelService(k)
}

func (tp tamperer) Redirect(dk dataplanetest.Key, backends []dataplane.Backend) error {
	k := addrKey(dk.Addr, dk.Protocol, dk.Port)
	ik, err := tp.internalService(k)
	if err != nil {
		return err
	}
	svcs, err := tp.k.Services()
	if err != nil {
		return err
	}
	s := svcs[ik]
	if s == nil {
		if err := tp.k.AddService(Service{Key: ik, Scheduler: "rr"}); err != nil {
			return err
		}
		addrs, err := tp.k.DeviceAddrs()
		if err != nil {
			return err
		}
		if !slices.Contains(addrs, k.Addr) {
			if err := tp.k.AddAddr(k.Addr); err != nil {
				return err
			}
		}
		s = &ServiceState{Dests: map[dataplane.Backend]Dest{}}
	}
	for b := range s.Dests {
		if err := tp.k.DelDest(ik, b); err != nil {
			return err
		}
	}
	for _, b := range backends {
		if err := tp.k.AddDest(ik, b, 1); err != nil {
			return err
		}
	}
	return nil
}
