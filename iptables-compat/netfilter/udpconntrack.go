package netfilter

import (
	"net/netip"
	"slices"
	"strconv"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
)

// UDPFrontends maps UDP frontends to the backends that serve them now.
// A frontend with no backends (none ready, or the frontend is gone) maps
// to an empty set: every entry to it is stale.
type UDPFrontends map[netip.AddrPort]map[netip.AddrPort]bool

// add records that b serves fe; a nil b records fe alone.
func (u UDPFrontends) add(fe netip.AddrPort, b *netip.AddrPort) {
	set := u[fe]
	if set == nil {
		set = map[netip.AddrPort]bool{}
		u[fe] = set
	}
	if b != nil {
		set[*b] = true
	}
}

// UDPConntrack keeps the kernel's UDP conntrack entries in line with the
// rules a netfilter backend wrote: after a sync it deletes every entry
// whose original destination is a UDP frontend and whose reply source is
// not a current backend of it, as kube-proxy's conntrack reconciler does.
//
// It compares with what the kernel holds rather than with what the
// previous sync removed, because a diff misses entries it never saw:
//   - those of backends that left while kpr was down (after a restart the
//     backend knows no previous state);
//   - those of datagrams that went out untranslated while a frontend had
//     no rule (before kpr first synced it, or while a Service gained its
//     first endpoint and its reject was gone before its DNAT was in):
//     no backend "left" when the endpoints come, yet the entry keeps the
//     client's flow untranslated for as long as it sends.
//
// Calls come from the backend's one sync goroutine.
type UDPConntrack struct {
	cleaner  ConntrackCleaner
	families []Family
	log      *zap.Logger
	// checked is set once every frontend has been compared with the
	// kernel after a successful sync. Until then each sync compares all of
	// them: at start the kernel may hold entries from before, and a failed
	// comparison is tried again.
	checked bool
	// failing is set while comparisons fail, so that a kernel that cannot
	// list conntrack entries is reported once, not at every sync.
	failing bool
	// found are UDP frontends the kernel's rules served when the backend
	// read them (at start, at a full sync). One that the next sync does not
	// serve has left while kpr was away (a Service deleted then): every
	// entry to it is stale, though no ServicePort of this process had it.
	found map[netip.AddrPort]bool
}

// FoundInKernel records UDP frontends that the kernel's rules serve as
// read from them; the next comparison deletes every entry to those the
// rules then no longer serve.
func (u *UDPConntrack) FoundInKernel(frontends []netip.AddrPort) {
	if u == nil || len(frontends) == 0 {
		return
	}
	if u.found == nil {
		u.found = map[netip.AddrPort]bool{}
	}
	for _, fe := range frontends {
		u.found[netip.AddrPortFrom(fe.Addr().Unmap(), fe.Port())] = true
	}
}

// NewUDPConntrack returns a UDPConntrack for a backend serving the UDP
// frontends of families; a nil cleaner deletes nothing.
func NewUDPConntrack(c ConntrackCleaner, families []Family, log *zap.Logger) *UDPConntrack {
	if log == nil {
		log = zap.NewNop()
	}
	return &UDPConntrack{cleaner: c, families: families, log: log}
}

// Synced deletes the stale entries once a sync has brought the rules
// from old to next, rewriting changed (every ServicePort when full).
// A sync that changed no UDP ServicePort leaves the entries alone, unless
// the comparison has yet to succeed once. A failure is logged, never
// returned: the rules are right, and the next comparison tries again.
func (u *UDPConntrack) Synced(old, next map[dataplane.ServicePortName]*dataplane.ServicePort, changed []dataplane.ServicePortName, full bool) {
	if u == nil || u.cleaner == nil {
		return
	}
	if !full && u.checked && len(u.found) == 0 && !touchesUDP(old, next, changed) {
		return
	}
	served := u.served(next)
	// A frontend a changed ServicePort no longer has is still one the
	// kernel may hold entries of: they are all stale.
	for _, n := range changed {
		if sp := old[n]; sp != nil {
			for _, fe := range sp.Frontends {
				if u.covers(fe) {
					served.add(netip.AddrPortFrom(fe.Addr.Unmap(), fe.Port), nil)
				}
			}
		}
	}
	for fe := range u.found {
		if slices.Contains(u.families, FamilyOf(fe.Addr())) {
			served.add(fe, nil)
		}
	}
	if len(served) == 0 {
		u.checked, u.found = true, nil
		return
	}
	n, err := u.cleaner.DeleteStaleUDP(served)
	if err != nil {
		u.checked = false
		log := u.log.Warn
		if u.failing {
			log = u.log.Debug
		}
		u.failing = true
		log("Could not delete the stale conntrack entries of UDP frontends; every sync tries again until it succeeds",
			zap.Int("frontends", len(served)), zap.Error(err))
		return
	}
	if u.failing {
		u.failing = false
		u.log.Info("Deleting the stale conntrack entries of UDP frontends works again")
	}
	u.checked, u.found = true, nil
	if n > 0 {
		u.log.Info("Deleted stale conntrack entries of UDP frontends", zap.Int("frontends", len(served)), zap.Int("entries", n))
	}
}

// served is every UDP frontend of sps in u's families with the backends
// that serve it, from inside the cluster or from outside.
func (u *UDPConntrack) served(sps map[dataplane.ServicePortName]*dataplane.ServicePort) UDPFrontends {
	out := UDPFrontends{}
	for _, sp := range sps {
		if sp == nil {
			continue
		}
		for _, fe := range sp.Frontends {
			if !u.covers(fe) {
				continue
			}
			key := netip.AddrPortFrom(fe.Addr.Unmap(), fe.Port)
			out.add(key, nil)
			for _, set := range [][]dataplane.Backend{fe.Backends, fe.ExternalBackends} {
				for _, b := range set {
					ap := netip.AddrPortFrom(b.Addr.Unmap(), b.Port)
					out.add(key, &ap)
				}
			}
		}
	}
	return out
}

// covers says whether fe is a UDP frontend of a family the backend
// programs: entries to any other address are not its business.
func (u *UDPConntrack) covers(fe dataplane.Frontend) bool {
	if fe.Protocol != dataplane.UDP {
		return false
	}
	return slices.Contains(u.families, FamilyOf(fe.Addr))
}

// touchesUDP says whether a changed ServicePort had or has a UDP frontend.
func touchesUDP(old, next map[dataplane.ServicePortName]*dataplane.ServicePort, changed []dataplane.ServicePortName) bool {
	for _, n := range changed {
		for _, sp := range []*dataplane.ServicePort{old[n], next[n]} {
			if sp == nil {
				continue
			}
			for _, fe := range sp.Frontends {
				if fe.Protocol == dataplane.UDP {
					return true
				}
			}
		}
	}
	return false
}

// UDPFrontendsOfRules returns the UDP frontends that the rules of chains
// in t match: a protocol of udp, one destination address and a
// destination port, as kpr's and kube-proxy's Service rules spell them.
func UDPFrontendsOfRules(t *SavedTable, chains ...string) []netip.AddrPort {
	if t == nil {
		return nil
	}
	var out []netip.AddrPort
	for _, r := range t.Rules {
		if len(r) < 2 || !slices.Contains(chains, r[1]) || RuleArg(r, "-p") != "udp" {
			continue
		}
		port, err := strconv.ParseUint(RuleArg(r, "--dport"), 10, 16)
		if err != nil {
			continue
		}
		dst := RuleArg(r, "-d")
		addr, err := netip.ParseAddr(dst)
		if err != nil {
			pfx, perr := netip.ParsePrefix(dst)
			if perr != nil || !pfx.IsSingleIP() {
				continue
			}
			addr = pfx.Addr()
		}
		out = append(out, netip.AddrPortFrom(addr.Unmap(), uint16(port)))
	}
	return out
}
