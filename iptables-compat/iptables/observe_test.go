package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The observer reads the tables back (iptables-save, of the fake or of a
// real iptables) and walks them as netfilter walks a new connection's first
// packet, so it reports what the rules do, not what the Plane meant them to
// do. Traffic of the node itself starts in nat OUTPUT (its source address
// is local), traffic from outside in nat PREROUTING; when no DNAT happens,
// filter OUTPUT, or INPUT and FORWARD, decide whether it is rejected. A
// match it cannot decide (statistic, a recent list, a source address) is
// taken both ways, so every endpoint a connection can reach is found.

// observed reads what the tables of both families serve.
func observed(r netfilter.Runner, v netfilter.Variant) (dataplanetest.State, error) {
	out := dataplanetest.State{}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		tables := map[string]*netfilter.SavedTable{}
		for _, table := range []string{tableNAT, tableFilter} {
			text, err := r.Run(netfilter.ToolsFor(v, fam).Save, []string{"-t", table}, nil)
			if err != nil {
				return nil, err
			}
			parsed, err := netfilter.ParseSave(text)
			if err != nil {
				return nil, err
			}
			tables[table] = parsed[table]
		}
		if err := observeFamily(tables, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type probe struct {
	dst      netip.Addr
	port     uint16
	proto    string
	srcLocal bool
}

func observeFamily(tables map[string]*netfilter.SavedTable, out dataplanetest.State) error {
	for _, k := range candidates(tables) {
		for _, tr := range []dataplanetest.Traffic{dataplanetest.Internal, dataplanetest.External} {
			pr := probe{dst: k.Addr, port: k.Port, proto: netfilter.ProtoName(k.Protocol), srcLocal: tr == dataplanetest.Internal}
			start := "PREROUTING"
			filterChains := []string{"INPUT", "FORWARD"}
			if tr == dataplanetest.Internal {
				start, filterChains = "OUTPUT", []string{"OUTPUT"}
			}
			outs, _, err := walk(tables[tableNAT], start, pr, 0, 0)
			if err != nil {
				return err
			}
			var s dataplanetest.Serving
			dnat := false
			for _, o := range outs {
				if o.verdict == "DNAT" {
					dnat = true
					if !slices.Contains(s.Backends, o.backend) {
						s.Backends = append(s.Backends, o.backend)
					}
					s.AffinityTimeout = max(s.AffinityTimeout, time.Duration(o.affinity)*time.Second)
					// The ranges restrict node traffic too, as in
					// kube-proxy, but the contract speaks only of
					// traffic from outside (dataplanetest.Serving).
					if tr == dataplanetest.External {
						s.SourceRanges = append(s.SourceRanges, o.ranges...)
					}
				}
			}
			if !dnat {
				rejected := false
				for _, c := range filterChains {
					fouts, _, err := walk(tables[tableFilter], c, pr, 0, 0)
					if err != nil {
						return err
					}
					for _, o := range fouts {
						rejected = rejected || o.verdict == "REJECT" || o.verdict == "DROP"
					}
				}
				if !rejected {
					continue // passes untouched: not served
				}
			}
			key := k
			key.Traffic = tr
			out[key] = s
		}
	}
	return nil
}

// candidates are the destinations any rule names with an address, a
// protocol and a port.
func candidates(tables map[string]*netfilter.SavedTable) []dataplanetest.Key {
	seen := map[dataplanetest.Key]bool{}
	var out []dataplanetest.Key
	for _, t := range tables {
		if t == nil {
			continue
		}
		for _, r := range t.Rules {
			d, port, proto := netfilter.RuleArg(r, "-d"), netfilter.RuleArg(r, "--dport"), netfilter.RuleArg(r, "-p")
			if d == "" || port == "" || proto == "" || negated(r, "-d") {
				continue
			}
			a, err := parseAddr(d)
			if err != nil {
				continue
			}
			n, _ := strconv.Atoi(port)
			k := dataplanetest.Key{Addr: a, Port: uint16(n), Protocol: netfilter.ParseProto(proto)}
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

func negated(r []string, flag string) bool {
	i := slices.Index(r, flag)
	return i > 0 && r[i-1] == "!"
}

func parseAddr(s string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if !p.IsSingleIP() {
			return netip.Addr{}, fmt.Errorf("%s is no single address", s)
		}
		return p.Addr(), nil
	}
	return netip.ParseAddr(s)
}

type outcome struct {
	verdict  string
	backend  dataplane.Backend
	affinity int
	// ranges are the sources a KUBE-FW-* chain on the way let through;
	// nil when the way had none.
	ranges []netip.Prefix
}

type matched uint8

const (
	no matched = iota
	yes
	maybe
)

// walk follows chain for pr. It returns the verdicts reachable and whether
// the walk can fall off the chain's end (or RETURN).
func walk(t *netfilter.SavedTable, chainName string, pr probe, depth, affinity int) ([]outcome, bool, error) {
	if t == nil {
		return nil, true, nil
	}
	if depth > 16 {
		return nil, false, fmt.Errorf("jumps nest deeper than 16 at %s: a loop?", chainName)
	}
	var outs []outcome
	for _, r := range t.Rules {
		if r[1] != chainName {
			continue
		}
		m := match(r, pr)
		if m == no {
			continue
		}
		aff := affinity
		if slices.Contains(r, "--rcheck") {
			if s, err := strconv.Atoi(netfilter.RuleArg(r, "--seconds")); err == nil {
				aff = s
			}
		}
		target := netfilter.RuleArg(r, "-j")
		terminal := false
		switch target {
		case "DNAT":
			ap, err := netip.ParseAddrPort(netfilter.RuleArg(r, "--to-destination"))
			if err != nil {
				return nil, false, fmt.Errorf("DNAT in %s: %w", chainName, err)
			}
			outs = append(outs, outcome{verdict: "DNAT", backend: dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}, affinity: aff})
			terminal = true
		case "REJECT", "DROP", "ACCEPT":
			outs = append(outs, outcome{verdict: target})
			terminal = true
		case "RETURN":
			if m == yes {
				return outs, true, nil
			}
		case "MARK", "MASQUERADE", "SNAT", "":
		default:
			if !t.HasChain(target) {
				return nil, false, fmt.Errorf("%s jumps to %s, which does not exist", chainName, target)
			}
			sub, falls, err := walk(t, target, pr, depth+1, aff)
			if err != nil {
				return nil, false, err
			}
			if strings.HasPrefix(target, prefixFirewall) {
				ranges, err := firewallRanges(t, target)
				if err != nil {
					return nil, false, err
				}
				for i := range sub {
					sub[i].ranges = ranges
				}
			}
			outs = append(outs, sub...)
			terminal = !falls
		}
		if terminal && m == yes {
			return outs, false, nil
		}
	}
	return outs, true, nil
}

// firewallRanges are the source addresses chain (a KUBE-FW-* chain) sends
// on to be DNATed.
func firewallRanges(t *netfilter.SavedTable, chain string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, r := range t.Rules {
		if r[1] != chain || netfilter.RuleArg(r, "-j") == "" {
			continue
		}
		s := netfilter.RuleArg(r, "-s")
		if s == "" || negated(r, "-s") {
			return nil, fmt.Errorf("%s lets traffic through without a source match: %v", chain, r)
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%s: source %q: %w", chain, s, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p)
	}
	return out, nil
}

// match decides r's matches for pr, up to its target.
func match(r []string, pr probe) matched {
	res := yes
	and := func(m matched) {
		if m == no || res == no {
			res = no
		} else if m == maybe {
			res = maybe
		}
	}
	for i := 2; i < len(r); i++ {
		w := r[i]
		if w == "-j" || w == "-g" {
			break
		}
		neg := i > 2 && r[i-1] == "!"
		arg := ""
		if i+1 < len(r) {
			arg = r[i+1]
		}
		is := func(b bool) matched {
			if b != neg {
				return yes
			}
			return no
		}
		switch w {
		case "-d":
			p, err := netip.ParsePrefix(arg)
			if err != nil {
				a, aerr := netip.ParseAddr(arg)
				if aerr != nil {
					return no
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			and(is(p.Contains(pr.dst)))
		case "-p":
			and(is(arg == pr.proto))
		case "--dport":
			and(is(arg == strconv.Itoa(int(pr.port))))
		case "--src-type":
			and(is(arg == "LOCAL" && pr.srcLocal))
		case "--dst-type":
			// Every frontend rule names its address; the addrtype match
			// only guards the jump to KUBE-NODEPORTS.
			and(is(arg == "LOCAL"))
		case "--ctstate":
			and(is(strings.Contains(arg, "NEW")))
		case "--mark":
			and(is(false)) // no mark is set before the DNAT decision
		case "-s", "--probability", "--rcheck", "-i", "-o":
			and(maybe)
		}
	}
	return res
}
