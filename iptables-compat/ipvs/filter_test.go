package ipvs

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// filterVerdict follows the INPUT jump to KPR-IPVS-FILTER and the chain's
// rules, as the tables in run hold them, with the sets as k holds them,
// for the first packet of a connection to dst: the target of the first
// rule that matches, or "" when none does (the packet goes on to IPVS or
// the node's sockets). It knows the matches the chain uses and fails the
// test on any other, so a rule it cannot read is not taken to pass.
func filterVerdict(t *testing.T, run netfilter.Runner, k *fakeKernel, dst netip.AddrPort, proto dataplane.Protocol) string {
	t.Helper()
	fam := netfilter.FamilyOf(dst.Addr())
	out, err := run.Run(netfilter.ToolsFor(netfilter.NFT, fam).Save, []string{"-t", tableFilter}, nil)
	if err != nil {
		t.Fatal(err)
	}
	table, err := parseTable(out, tableFilter)
	if err != nil || table == nil {
		t.Fatalf("read the %s filter table: %v", fam, err)
	}
	if !table.HasJump(jump(tableFilter, "INPUT", "", chainAccessFilter)) {
		return ""
	}
	member := func(set, dirs string) bool {
		e := Entry{Addr: dst.Addr()}
		switch dirs {
		case "dst,dst":
			e.Proto, e.Port = proto, dst.Port()
		case "dst":
		default:
			t.Fatalf("filterVerdict does not know the set match %s %s", set, dirs)
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.sets[set][e]
	}
rules:
	for _, r := range table.ChainRules(chainAccessFilter) {
		target := ""
		for i := 2; i < len(r); i++ {
			switch {
			case r[i] == "-m" && i+1 < len(r) && (r[i+1] == "set" || r[i+1] == "conntrack"):
				i++
			case r[i] == "--match-set" && i+2 < len(r):
				neg := r[i-1] == "!"
				if member(r[i+1], r[i+2]) == neg {
					continue rules
				}
				i += 2
			case r[i] == "!" && i+1 < len(r) && r[i+1] == "--match-set":
			case r[i] == "--ctstate" && i+1 < len(r) && r[i+1] == "NEW":
				i++ // a first packet is NEW
			case r[i] == "-j" && i+1 < len(r):
				target = r[i+1]
				i++
			case r[i] == "--reject-with" && i+1 < len(r) && target == "REJECT":
				i++
			default:
				t.Fatalf("filterVerdict does not know %q in %q", r[i], r)
			}
		}
		return target
	}
	return ""
}

// KPR-IPVS-FILTER, over the fake kernel and in-memory iptables: a new
// connection to a Service address bound to kpr-ipvs0 on a port that is
// not one of its Services' ports is rejected, in both families; Service
// ports pass, and so does every port of the node's own addresses (where
// NodePorts are), and the healthCheckNodePort of an externalTrafficPolicy
// Local Service on that Service's addresses, where a cloud load balancer
// may probe it (kube-proxy's KUBE-HEALTH-CHECK-NODE-PORT). Addresses leave
// the filter with their last Service.
func TestAccessFilterRejectsHostPortsOnServiceAddresses(t *testing.T) {
	k, run := newFakes()
	p := fakePlane(t, k, run)
	web := dataplane.ServicePortName{Namespace: "shop", Name: "web", Protocol: dataplane.TCP}
	dns := dataplane.ServicePortName{Namespace: "kube-system", Name: "dns", Protocol: dataplane.UDP}
	sps := map[dataplane.ServicePortName]*dataplane.ServicePort{
		web: {Name: web, HealthCheckNodePort: 32100, Frontends: []dataplane.Frontend{
			fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backends("10.244.0.1:8080"), nil),
			fe(dataplane.NodePort, "192.168.1.10:30080", dataplane.TCP, backends("10.244.0.1:8080"), nil),
			fe(dataplane.ExternalIP, "203.0.113.5:80", dataplane.TCP, backends("10.244.0.1:8080"), nil),
			fe(dataplane.LoadBalancer, "198.51.100.10:443", dataplane.TCP, backends("10.244.0.1:8080"), backends("10.244.0.1:8080"))}},
		// The same ClusterIP, another port and protocol: the address is
		// bound once and stays while either Service has it.
		dns: {Name: dns, Frontends: []dataplane.Frontend{
			fe(dataplane.ClusterIP, "10.96.0.1:53", dataplane.UDP, backends("10.244.0.2:53"), nil),
			fe(dataplane.ClusterIP, "[fd00:10:96::1]:53", dataplane.UDP, backends("[fd00::2]:53"), nil)}},
	}
	if err := p.Reconcile(sps); err != nil {
		t.Fatal(err)
	}
	check := func(when string, cases map[string]string) {
		t.Helper()
		for c, want := range cases {
			proto, ap := dataplane.TCP, c
			if c[:4] == "udp " {
				proto, ap = dataplane.UDP, c[4:]
			}
			if got := filterVerdict(t, run, k, netip.MustParseAddrPort(ap), proto); got != want {
				t.Errorf("%s: a new connection to %s meets %q in KPR-IPVS-FILTER, want %q", when, c, got, want)
			}
		}
	}
	check("both Services", map[string]string{
		"10.96.0.1:80":            "RETURN",
		"udp 10.96.0.1:53":        "RETURN",
		"10.96.0.1:22":            "REJECT",
		"udp 10.96.0.1:80":        "REJECT",
		"203.0.113.5:80":          "RETURN",
		"203.0.113.5:10250":       "REJECT",
		"198.51.100.10:443":       "RETURN",
		"198.51.100.10:22":        "REJECT",
		"198.51.100.10:32100":     "RETURN",
		"udp 198.51.100.10:32100": "REJECT",
		"192.168.1.10:22":         "",
		"192.168.1.10:30080":      "RETURN",
		"udp [fd00:10:96::1]:53":  "RETURN",
		"[fd00:10:96::1]:22":      "REJECT",
	})

	if err := p.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{web: nil}); err != nil {
		t.Fatal(err)
	}
	check("dns alone", map[string]string{
		"udp 10.96.0.1:53":  "RETURN",
		"10.96.0.1:80":      "REJECT",
		"10.96.0.1:32100":   "REJECT",
		"198.51.100.10:443": "",
		"203.0.113.5:10250": "",
	})
	bound, _, _ := k.SetEntries(setName(setBound, false))
	if !slices.Equal(bound, []Entry{{Addr: netip.MustParseAddr("10.96.0.1")}}) {
		t.Errorf("%s = %v, want only 10.96.0.1", setName(setBound, false), bound)
	}
}
