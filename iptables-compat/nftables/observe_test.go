package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// The observer reads kpr's table back and walks it as netfilter walks a
// new connection's first packet, so it reports what the rules do, not
// what the Plane meant them to do. Traffic of the node itself starts in
// nat-output (its source is local), traffic from outside in
// filter-prerouting-pre-dnat, then nat-prerouting; when no DNAT happens,
// filter-output, or filter-input, decide whether it is rejected or
// dropped. numgen and an affinity set are taken every way, so every
// endpoint a connection can reach is found. A rule the observer cannot
// read is an error, so that what a tamperer or a bug writes shows.

// snapshot is kpr's table as the observer reads it.
type snapshot struct {
	chains   map[string][]string
	elements map[string]map[string]string // map → "addr . proto . port" → verdict
	sets     map[string]time.Duration     // affinity set → timeout
}

// snapshotOf reads a knftables.Fake's table.
func snapshotOf(fake *knftables.Fake) snapshot {
	s := snapshot{chains: map[string][]string{}, elements: map[string]map[string]string{}, sets: map[string]time.Duration{}}
	t := fake.Table
	if t == nil {
		return s
	}
	for name, c := range t.Chains {
		s.chains[name] = []string{}
		for _, r := range c.Rules {
			s.chains[name] = append(s.chains[name], r.Rule)
		}
	}
	for name, m := range t.Maps {
		s.elements[name] = map[string]string{}
		for _, e := range m.Elements {
			s.elements[name][strings.Join(e.Key, " . ")] = strings.Join(e.Value, " ")
		}
	}
	for name, set := range t.Sets {
		if set.Timeout != nil {
			s.sets[name] = *set.Timeout
		}
	}
	return s
}

type probe struct {
	fam      netfilter.Family
	dst      netip.Addr
	port     uint16
	proto    string
	srcLocal bool
}

func (pr probe) key() string {
	return pr.dst.String() + " . " + pr.proto + " . " + strconv.Itoa(int(pr.port))
}

// outcome is where one path through the chains ends.
type outcome struct {
	verdict  string // dnat, reject, drop, accept (fell through or returned)
	backend  dataplane.Backend
	affinity time.Duration
	ranges   []netip.Prefix // the firewall chain's sources let through
}

// observed is what the snapshot serves.
func (s snapshot) observed() (dataplanetest.State, error) {
	out := dataplanetest.State{}
	for _, k := range s.candidates() {
		for _, tr := range []dataplanetest.Traffic{dataplanetest.Internal, dataplanetest.External} {
			pr := probe{fam: netfilter.FamilyOf(k.Addr), dst: k.Addr, port: k.Port, proto: netfilter.ProtoName(k.Protocol), srcLocal: tr == dataplanetest.Internal}
			var ranges []netip.Prefix
			if tr == dataplanetest.External {
				fw, err := s.walk(chainFilterPreDNAT, pr, 0)
				if err != nil {
					return nil, err
				}
				for _, o := range fw {
					ranges = append(ranges, o.ranges...)
				}
			}
			start, filter := chainNATOutput, chainFilterOutput
			if tr == dataplanetest.External {
				start, filter = chainNATPrerouting, chainFilterInput
			}
			outs, err := s.walk(start, pr, 0)
			if err != nil {
				return nil, err
			}
			var sv dataplanetest.Serving
			dnat := false
			for _, o := range outs {
				if o.verdict != "dnat" {
					continue
				}
				dnat = true
				if !slices.Contains(sv.Backends, o.backend) {
					sv.Backends = append(sv.Backends, o.backend)
				}
				sv.AffinityTimeout = max(sv.AffinityTimeout, o.affinity)
			}
			if dnat {
				if tr == dataplanetest.External {
					sv.SourceRanges = ranges
				}
				out[dataplanetest.Key{Addr: k.Addr, Port: k.Port, Protocol: k.Protocol, Traffic: tr}] = sv
				continue
			}
			fouts, err := s.walk(filter, pr, 0)
			if err != nil {
				return nil, err
			}
			if slices.ContainsFunc(fouts, func(o outcome) bool { return o.verdict == "reject" || o.verdict == "drop" }) {
				out[dataplanetest.Key{Addr: k.Addr, Port: k.Port, Protocol: k.Protocol, Traffic: tr}] = dataplanetest.Serving{}
			}
		}
	}
	return out, nil
}

// candidates are every destination a map or a rule names.
func (s snapshot) candidates() []dataplanetest.Key {
	seen := map[dataplanetest.Key]bool{}
	var out []dataplanetest.Key
	add := func(addr, proto, port string) {
		a, err := netip.ParseAddr(addr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return
		}
		k := dataplanetest.Key{Addr: a, Port: uint16(n), Protocol: netfilter.ParseProto(proto)}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	for _, els := range s.elements {
		for key := range els {
			if parts := strings.Split(key, " . "); len(parts) == 3 {
				add(parts[0], parts[1], parts[2])
			}
		}
	}
	for _, rules := range s.chains {
		for _, r := range rules {
			if d, ok := destMatch(strings.Fields(r)); ok {
				add(d.addr, d.proto, d.port)
			}
		}
	}
	return out
}

type dest struct{ addr, proto, port string }

// destMatch reads a rule that begins "ip daddr A tcp dport P".
func destMatch(w []string) (dest, bool) {
	if len(w) >= 6 && (w[0] == "ip" || w[0] == "ip6") && w[1] == "daddr" && w[4] == "dport" && !strings.HasPrefix(w[2], "@") && w[2] != "." {
		return dest{w[2], w[3], w[5]}, true
	}
	return dest{}, false
}

const maxDepth = 16

// walk follows pr through chain and returns where its paths end.
func (s snapshot) walk(chain string, pr probe, depth int) ([]outcome, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("chains nested deeper than %d at %s", maxDepth, chain)
	}
	rules, ok := s.chains[chain]
	if !ok {
		if depth > 0 {
			return nil, fmt.Errorf("a rule goes to chain %q, which does not exist", chain)
		}
		return []outcome{{verdict: "accept"}}, nil
	}
	var out []outcome
	// aff is the timeout of the affinity set the chain's packets update:
	// the DNAT after it makes a client stick.
	var aff time.Duration
	for _, r := range rules {
		w := strings.Fields(r)
		verdict, matched, branches, err := s.rule(w, pr, depth)
		if err != nil {
			return nil, fmt.Errorf("chain %s, rule %q: %w", chain, r, err)
		}
		if !matched {
			continue
		}
		if branches != nil {
			// Taken one way (the branch) and the other (the rules after).
			for _, b := range branches {
				if b.verdict == "dnat" {
					b.affinity = max(b.affinity, aff)
				}
				out = append(out, b)
			}
			continue
		}
		switch v := strings.Fields(verdict); {
		case len(v) == 0:
			continue
		case v[0] == "update":
			aff = s.sets[strings.TrimPrefix(v[1], "@")]
		case v[0] == "return":
			return append(out, outcome{verdict: "accept"}), nil
		case v[0] == "jump" || v[0] == "goto":
			sub, err := s.walk(v[1], pr, depth+1)
			if err != nil {
				return nil, err
			}
			if v[0] == "goto" {
				return append(out, sub...), nil
			}
			// A jump ends the walk only where the chain it jumped to did.
			cont := false
			for _, o := range sub {
				if o.verdict == "accept" && o.ranges == nil {
					cont = true
				} else {
					out = append(out, o)
				}
			}
			if !cont {
				return out, nil
			}
		default:
			return append(out, outcome{verdict: v[0]}), nil
		}
	}
	return append(out, outcome{verdict: "accept"}), nil
}

// rule reads one rule for pr: its verdict when it matches, or the
// outcomes of the paths it branches into (numgen, a DNAT).
func (s snapshot) rule(w []string, pr probe, depth int) (verdict string, matched bool, branches []outcome, err error) {
	word := addrWord(pr.fam)
	switch {
	case len(w) == 0:
		return "", false, nil, nil
	case (w[0] == "ip" || w[0] == "ip6") && len(w) == 10 && w[1] == "daddr" && w[2] == "." && w[8] == "vmap":
		if w[0] != word {
			return "", false, nil, nil
		}
		v, ok := s.elements[strings.TrimPrefix(w[9], "@")][pr.key()]
		return v, ok, nil, nil
	case w[0] == "fib" && len(w) >= 5 && w[1] == "saddr" && w[2] == "type" && w[3] == "local":
		return strings.Join(w[4:], " "), pr.srcLocal, nil, nil
	case w[0] == "ct" && len(w) >= 4 && w[1] == "state" && w[2] == "new":
		return strings.Join(w[3:], " "), true, nil, nil
	case w[0] == "numgen":
		// numgen random mod N vmap { 0 : goto A , 1 : goto B }
		for i, x := range w {
			if x == "goto" && i+1 < len(w) {
				sub, err := s.walk(strings.TrimSuffix(w[i+1], ","), pr, depth+1)
				if err != nil {
					return "", false, nil, err
				}
				branches = append(branches, sub...)
			}
		}
		return "", true, branches, nil
	case w[0] == "meta" && len(w) >= 12 && w[1] == "l4proto" && w[3] == "numgen" && w[len(w)-4] == "dnat" && w[len(w)-2] == "to":
		// meta l4proto tcp numgen random mod N == 0 dnat ip to A:P (nft
		// lists it without the ==): taken
		// one way (the DNAT) and the other (the rules after).
		ap, err := netip.ParseAddrPort(w[len(w)-1])
		if err != nil {
			return "", false, nil, err
		}
		if w[2] != pr.proto {
			return "", false, nil, nil
		}
		return "", true, []outcome{{verdict: "dnat", backend: dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}}}, nil
	case w[0] == "meta" && len(w) >= 7 && w[1] == "l4proto" && w[3] == "dnat" && w[5] == "to":
		ap, err := netip.ParseAddrPort(w[6])
		if err != nil {
			return "", false, nil, err
		}
		if w[2] != pr.proto {
			return "", false, nil, nil
		}
		return "", true, []outcome{{verdict: "dnat", backend: dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}}}, nil
	case w[0] == "update" && len(w) >= 2:
		return "update " + w[1], true, nil, s.noteAffinity(w[1])
	case w[0] == "meta" && len(w) >= 3 && w[1] == "mark":
		return "", false, nil, nil
	case w[0] == "masquerade" || w[0] == "reject" || w[0] == "drop" || w[0] == "accept":
		return w[0], true, nil, nil
	case (w[0] == "ip" || w[0] == "ip6") && len(w) >= 4 && w[1] == "saddr":
		return s.saddrRule(w, pr, depth)
	case w[0] == "jump" || w[0] == "goto":
		return strings.Join(w, " "), true, nil, nil
	}
	if d, ok := destMatch(w); ok {
		rest := w[6:]
		match := d.addr == pr.dst.String() && d.proto == pr.proto && d.port == strconv.Itoa(int(pr.port))
		// "... ip saddr != CIDR jump mark-for-masquerade" marks only.
		if len(rest) >= 2 && rest[len(rest)-1] == chainMarkMasq {
			return "", false, nil, nil
		}
		return strings.Join(rest, " "), match, nil, nil
	}
	return "", false, nil, fmt.Errorf("the observer cannot read it")
}

// saddrRule reads the rules that match the source address: the hairpin
// mark (no effect on where a packet goes), an affinity lookup (taken both
// ways), a firewall chain's drop of other sources.
func (s snapshot) saddrRule(w []string, pr probe, depth int) (string, bool, []outcome, error) {
	switch {
	case w[len(w)-1] == chainMarkMasq:
		return "", false, nil, nil
	case strings.HasPrefix(w[2], "@") && len(w) == 5 && w[3] == "goto":
		sub, err := s.walk(w[4], pr, depth+1)
		if err != nil {
			return "", false, nil, err
		}
		// The affinity comes from the endpoint chain's update of the set:
		// a lookup in a set nothing fills makes nobody stick.
		// Both ways: the branch's outcomes, and on (the numgen after).
		return "", true, sub, nil
	case w[2] == "!=" && w[len(w)-1] == "drop":
		// nft lists a set of one without braces.
		var ranges []netip.Prefix
		for _, x := range w[3 : len(w)-1] {
			x = strings.TrimSuffix(x, ",")
			if x == "" || x == "{" || x == "}" {
				continue
			}
			p, err := netip.ParsePrefix(x)
			if err != nil {
				a, aerr := netip.ParseAddr(x)
				if aerr != nil {
					return "", false, nil, err
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			ranges = append(ranges, p)
		}
		return "", true, []outcome{{verdict: "accept", ranges: ranges}}, nil
	}
	return "", false, nil, fmt.Errorf("the observer cannot read it")
}

// noteAffinity checks that an affinity set a rule updates exists.
func (s snapshot) noteAffinity(set string) error {
	if _, ok := s.sets[strings.TrimPrefix(set, "@")]; !ok {
		return fmt.Errorf("the rule updates set %s, which does not exist or has no timeout", set)
	}
	return nil
}
