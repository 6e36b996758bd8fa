package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// addService plans a new virtual server and its real servers.
func (p *Plane) addService(pl *plan, s *ServiceState) {
	k := s.Key
	pl.add(func() error { return wrap(p.k.AddService(s.Service), "add virtual server %s", k) },
		func() error { return p.k.DelService(k) })
	for _, b := range sortedBackends(s.Dests) {
		// Undone with the virtual server.
		pl.add(func() error { return wrap(p.k.AddDest(k, b, s.Dests[b].Weight), "add real server %s to %s", b, k) }, nil)
	}
}

// restoreService puts a deleted virtual server back as it was.
func (p *Plane) restoreService(s *ServiceState) error {
	if err := p.k.AddService(s.Service); err != nil {
		return err
	}
	for _, b := range sortedBackends(s.Dests) {
		if err := p.k.AddDest(s.Key, b, s.Dests[b].Weight); err != nil {
			return err
		}
	}
	return nil
}

// updateService plans the changes from have to want of one virtual
// server. A real server that leaves drains: its weight goes to 0, so that
// it gets no new connections while those it has go on, and the reaper
// deletes it once they are gone. UDP has no connection that ends, so a
// UDP real server is deleted at once, as in kube-proxy.
func (p *Plane) updateService(pl *plan, have, want *ServiceState, udp bool) {
	k := have.Key
	after := pl.after.services[k]
	if have.Service != want.Service {
		old := have.Service
		pl.add(func() error { return wrap(p.k.UpdateService(want.Service), "update virtual server %s", k) },
			func() error { return p.k.UpdateService(old) })
		after.Service = want.Service
	}
	for _, b := range sortedBackends(want.Dests) {
		d, ok := have.Dests[b]
		switch {
		case !ok:
			pl.add(func() error { return wrap(p.k.AddDest(k, b, 1), "add real server %s to %s", b, k) },
				func() error { return p.k.DelDest(k, b) })
		case d.Weight != 1:
			pl.add(func() error {
				return wrap(p.k.UpdateDest(k, b, 1), "set the weight of real server %s of %s to 1", b, k)
			},
				func() error { return p.k.UpdateDest(k, b, d.Weight) })
		default:
			continue
		}
		after.Dests[b] = Dest{Weight: 1}
	}
	for _, b := range sortedBackends(have.Dests) {
		d := have.Dests[b]
		if _, stays := want.Dests[b]; stays {
			continue
		}
		switch {
		case udp:
			pl.add(func() error { return wrap(p.k.DelDest(k, b), "delete real server %s of %s", b, k) },
				func() error { return p.k.AddDest(k, b, d.Weight) })
			delete(after.Dests, b)
		case d.Weight != 0:
			pl.add(func() error { return wrap(p.k.UpdateDest(k, b, 0), "drain real server %s of %s (weight 0)", b, k) },
				func() error { return p.k.UpdateDest(k, b, d.Weight) })
			after.Dests[b] = Dest{Weight: 0}
		}
	}
}

// udp reports whether k serves UDP: a fwmark virtual server serves the
// protocol of the frontend whose mark it has.
func (p *Plane) udp(k ServiceKey, w *kstate) bool {
	if k.FWMark == 0 {
		return k.Proto == dataplane.UDP
	}
	for _, t := range []*kstate{w, p.cur} {
		for fe, m := range t.internal {
			if m == k.FWMark && fe.IPv6 == k.IPv6 {
				return fe.Proto == dataplane.UDP
			}
		}
	}
	return false
}

// planRules plans the iptables writes of fam: in a full write (a
// Reconcile, with saved the tables as read) both tables, with the jumps
// saved lacks; otherwise nat alone, and only if the marks changed.
func (p *Plane) planRules(pl *plan, fam netfilter.Family, w *kstate, saved map[string]*netfilter.SavedTable, full bool) {
	next := p.ruleSet(fam, w.internal)
	prev := p.ruleSet(fam, p.cur.internal)
	for _, table := range tables {
		if !full && (table != tableNAT || slices.Equal(internalRules(fam, w.internal), internalRules(fam, p.cur.internal))) {
			continue
		}
		var jumps []netfilter.BaseJump
		if full {
			jumps = netfilter.MissingJumps(table, baseJumps, saved[table])
		}
		fwd, back := next.render(table, jumps), prev.render(table, nil)
		pl.add(func() error { return wrap(p.restore(fam, fwd), "write the %s %s table", fam, table) },
			func() error { return p.restore(fam, back) })
	}
	for k := range pl.after.internal {
		if k.IPv6 == (fam == netfilter.IPv6) {
			delete(pl.after.internal, k)
		}
	}
	for k, m := range w.internal {
		if k.IPv6 == (fam == netfilter.IPv6) {
			pl.after.internal[k] = m
		}
	}
}

func (p *Plane) ruleSet(fam netfilter.Family, internal map[ServiceKey]uint32) ruleSet {
	return newRuleSet(fam, p.masq, internal)
}

func (p *Plane) restore(fam netfilter.Family, input []byte) error {
	_, err := p.run.Run(p.tools[fam].Restore, []string{"--noflush"}, input)
	return err
}

func (p *Plane) save(fam netfilter.Family, table string) (*netfilter.SavedTable, error) {
	out, err := p.run.Run(p.tools[fam].Save, []string{"-t", table}, nil)
	if err == nil {
		var t *netfilter.SavedTable
		if t, err = parseTable(out, table); err == nil {
			return t, nil
		}
	}
	return nil, fmt.Errorf("read the %s %s table: %w", fam, table, err)
}

// parseTable is table in the iptables-save output out; nil if out lacks it.
func parseTable(out []byte, table string) (*netfilter.SavedTable, error) {
	tables, err := netfilter.ParseSave(out)
	if err != nil {
		return nil, err
	}
	return tables[table], nil
}

// savedRules are the rules of chain as iptables-save spells them, to
// compare with the rules the Plane writes, which are in that spelling.
func savedRules(t *netfilter.SavedTable, chain string) []string {
	var out []string
	for _, r := range t.ChainRules(chain) {
		out = append(out, netfilter.JoinWords(r))
	}
	return out
}

// read reads the Plane's state from the kernel: the addresses of the
// dummy interface, the members of kpr's sets, the marks of the nat rules,
// and the virtual servers that are kpr's (owned), with their real servers.
// It also returns the tables it saved.
func (p *Plane) read() (*kstate, map[netfilter.Family]map[string]*netfilter.SavedTable, error) {
	t := newKState()
	addrs, err := p.k.DeviceAddrs()
	if err != nil {
		return nil, nil, fmt.Errorf("list the addresses of %s: %w", DeviceName, err)
	}
	for _, a := range addrs {
		t.bound[a.Unmap()] = true
	}
	for _, s := range setSpecs() {
		entries, ok, err := p.k.SetEntries(s.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("list ipset %s: %w", s.Name, err)
		}
		if !ok {
			continue
		}
		for _, e := range entries {
			t.entries[setEntry{s.Name, e}] = true
		}
	}
	saved := map[netfilter.Family]map[string]*netfilter.SavedTable{}
	for _, fam := range p.families {
		saved[fam] = map[string]*netfilter.SavedTable{}
		for _, table := range tables {
			st, err := p.save(fam, table)
			if err != nil {
				return nil, nil, err
			}
			saved[fam][table] = st
		}
		for k, m := range parseInternal(saved[fam][tableNAT]) {
			t.internal[k] = m
		}
	}
	svcs, err := p.k.Services()
	if err != nil {
		return nil, nil, fmt.Errorf("list the IPVS virtual servers: %w", err)
	}
	for k, s := range svcs {
		if owned(k, t) {
			t.services[k] = s
		}
	}
	return t, saved, nil
}

// owned reports whether the virtual server k is kpr's, judged by what t
// read: one of kpr's firewall marks, an address on kpr's dummy interface,
// or a frontend in one of kpr's sets (a NodePort's address is the node's
// own). Others' virtual servers in the same namespace are left alone.
func owned(k ServiceKey, t *kstate) bool {
	if k.FWMark != 0 {
		return ownMark(k.FWMark)
	}
	if t.bound[k.Addr] {
		return true
	}
	e := Entry{Addr: k.Addr, Proto: k.Proto, Port: k.Port}
	for _, role := range []string{setClusterIP, setExternal, setExternalLocal} {
		if t.entries[setEntry{setName(role, k.IPv6), e}] {
			return true
		}
	}
	return false
}

func sortedKeys(m map[ServiceKey]bool) []ServiceKey {
	out := make([]ServiceKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, compareKeys)
	return out
}

func sortedBackends(m map[dataplane.Backend]Dest) []dataplane.Backend {
	out := make([]dataplane.Backend, 0, len(m))
	for b := range m {
		out = append(out, b)
	}
	slices.SortFunc(out, dataplane.Backend.Compare)
	return out
}

func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func sortedEntries(m map[setEntry]bool) []setEntry {
	out := make([]setEntry, 0, len(m))
	for e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b setEntry) int {
		if a.set != b.set {
			if a.set < b.set {
				return -1
			}
			return 1
		}
		as, bs := a.entry.String(), b.entry.String()
		switch {
		case as < bs:
			return -1
		case as > bs:
			return 1
		}
		return 0
	})
	return out
}
