package ipvs

import (
	"embed"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden is testdata/ built into the test binary, so that it runs where
// the source tree is not, as in the kernel-matrix VMs.
//
//go:embed testdata
var golden embed.FS

func backends(s ...string) []dataplane.Backend {
	out := []dataplane.Backend{}
	for _, a := range s {
		ap := netip.MustParseAddrPort(a)
		out = append(out, dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()})
	}
	return out
}

func fe(kind dataplane.FrontendKind, addr string, proto dataplane.Protocol, bs []dataplane.Backend, ext []dataplane.Backend) dataplane.Frontend {
	ap := netip.MustParseAddrPort(addr)
	return dataplane.Frontend{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto, Kind: kind, Backends: bs, ExternalBackends: ext}
}

// goldenCases are representative ServicePorts, one golden file each.
func goldenCases() map[string]*dataplane.ServicePort {
	pods := backends("10.244.0.1:8080", "10.244.1.2:8080")
	local := backends("10.244.0.1:8080")
	return map[string]*dataplane.ServicePort{
		"clusterip": {Name: dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP},
			Frontends: []dataplane.Frontend{fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, pods, nil)}},
		// Rendered under goldenMasquerade's --masquerade-all.
		"masquerade-all": {Name: dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP},
			Frontends: []dataplane.Frontend{
				fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, pods, nil),
				fe(dataplane.ClusterIP, "[fd00:10:96::1]:80", dataplane.TCP, backends("[fd00::1]:8080"), nil),
			}},
		"no-endpoints": {Name: dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP},
			Frontends: []dataplane.Frontend{fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, nil, nil)}},
		"nodeport-cluster-affinity": {Name: dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.UDP},
			AffinityTimeout: 3 * time.Hour,
			Frontends: []dataplane.Frontend{
				fe(dataplane.ClusterIP, "10.96.0.1:53", dataplane.UDP, pods, nil),
				fe(dataplane.NodePort, "192.168.1.10:30053", dataplane.UDP, pods, nil),
				// Not servable by IPVS: left out.
				fe(dataplane.NodePort, "127.0.0.1:30053", dataplane.UDP, pods, nil),
			}},
		"local-policy-source-ranges": {Name: dataplane.ServicePortName{Namespace: "shop", Name: "cart", Port: "https", Protocol: dataplane.TCP},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
			Frontends: []dataplane.Frontend{
				fe(dataplane.ClusterIP, "10.96.0.2:443", dataplane.TCP, pods, nil),
				fe(dataplane.NodePort, "192.168.1.10:30443", dataplane.TCP, pods, local),
				fe(dataplane.ExternalIP, "203.0.113.10:443", dataplane.TCP, pods, local),
				fe(dataplane.LoadBalancer, "198.51.100.10:443", dataplane.TCP, pods, local),
				// Local, but every endpoint is local: one virtual server.
				fe(dataplane.LoadBalancer, "198.51.100.11:443", dataplane.TCP, local, local),
			}},
		"dual-stack": {Name: dataplane.ServicePortName{Namespace: "default", Name: "web", Protocol: dataplane.TCP},
			Frontends: []dataplane.Frontend{
				fe(dataplane.ClusterIP, "10.96.0.1:80", dataplane.TCP, backends("10.244.0.1:8080", "[fd00::1]:8080"), nil),
				fe(dataplane.ClusterIP, "[fd00:10:96::1]:80", dataplane.TCP, backends("10.244.0.1:8080", "[fd00::1]:8080"), nil),
			}},
	}
}

// goldenMasquerade is the --masquerade-all and --cluster-cidr the golden
// case name is rendered and programmed under.
func goldenMasquerade(name string) netfilter.Masquerade {
	m := netfilter.Masquerade{Local: netfilter.LocalTraffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}}
	m.All = name == "masquerade-all"
	return m
}

// renderDesired prints what sp asks of the kernel, one item a line in a
// stable order, and the nat and filter rules of both families under masq.
func renderDesired(t *testing.T, sp *dataplane.ServicePort, masq netfilter.Masquerade) string {
	m := newMarks(markIDMask)
	c, err := desire(sp, "rr", true, m.get)
	if err != nil {
		t.Fatal(err)
	}
	w := want(map[dataplane.ServicePortName]*contribution{sp.Name: c})
	var b strings.Builder
	for _, k := range sortedServiceKeys(w.services) {
		s := w.services[k]
		fmt.Fprintf(&b, "virtual server %s scheduler %s persistence %ds:", k, s.Scheduler, s.Timeout)
		for _, be := range sortedBackends(s.Dests) {
			fmt.Fprintf(&b, " %s@%d", be, s.Dests[be].Weight)
		}
		b.WriteString("\n")
	}
	for _, a := range sortedAddrs(w.bound) {
		fmt.Fprintf(&b, "bind %s to %s\n", a, DeviceName)
	}
	for _, e := range sortedEntries(w.entries) {
		fmt.Fprintf(&b, "ipset %s %s\n", e.set, e.entry)
	}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		rs := newRuleSet(fam, masq, w.internal)
		for _, table := range tables {
			fmt.Fprintf(&b, "# %s %s\n", fam, table)
			b.Write(rs.render(table, netfilter.MissingJumps(table, baseJumps, nil)))
		}
	}
	return b.String()
}

// The desired state of representative ServicePorts against checked-in
// expectations (go test -run TestDesiredGolden -update rewrites them).
func TestDesiredGolden(t *testing.T) {
	for name, sp := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			got := renderDesired(t, sp, goldenMasquerade(name))
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := golden.ReadFile(path)
			if *update {
				want, err = os.ReadFile(path)
			}
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("desired state of %s differs from %s:\n--- got\n%s\n--- want\n%s", name, path, got, want)
			}
		})
	}
}

// Options.Masquerade reaches the rules the Plane writes: with
// --masquerade-all every connection to a ClusterIP is marked, the pods'
// from inside --cluster-cidr too, and the drift check holds over it;
// without it only those from outside --cluster-cidr and the node's own.
func TestMasqueradeAllMarksEveryClusterIPConnection(t *testing.T) {
	sp := goldenCases()["masquerade-all"]
	all := "-A " + chainServices + " -m set --match-set " + setName(setClusterIP, false) + " dst,dst -j " + chainMarkMasq
	for _, masqAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("masquerade-all=%v", masqAll), func(t *testing.T) {
			k, run := newFakes()
			masq := goldenMasquerade("clusterip")
			masq.All = masqAll
			p, err := New(Options{Kernel: k, Runner: run, Masquerade: masq,
				Families: map[netfilter.Family]netfilter.Tools{netfilter.IPv4: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv4),
					netfilter.IPv6: netfilter.ToolsFor(netfilter.NFT, netfilter.IPv6)}})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Reconcile(map[dataplane.ServicePortName]*dataplane.ServicePort{sp.Name: sp}); err != nil {
				t.Fatal(err)
			}
			out, err := run.Run("iptables-nft-save", []string{"-t", tableNAT}, nil)
			if err != nil {
				t.Fatal(err)
			}
			nat, err := parseTable(out, tableNAT)
			if err != nil {
				t.Fatal(err)
			}
			rules := savedRules(nat, chainServices)
			if got := slices.Contains(rules, all); got != masqAll {
				t.Errorf("%s has the rule that marks every connection to a ClusterIP: %v, want %v:\n%s",
					chainServices, got, masqAll, strings.Join(rules, "\n"))
			}
			fromOutside := slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(r, "! -s 10.244.0.0/16") })
			if fromOutside == masqAll {
				t.Errorf("%s marks connections from outside --cluster-cidr by a rule of their own: %v, want %v:\n%s",
					chainServices, fromOutside, !masqAll, strings.Join(rules, "\n"))
			}
			if !dataplanetest.DriftCheckHolds(t, p) {
				t.Error("the drift check finds drift in what the Plane has just written")
			}
		})
	}
}

// Under externalTrafficPolicy Local a frontend whose local endpoints are
// not all its endpoints gets a fwmark virtual server for the node's own
// traffic, with every endpoint, and the nat rule that marks that traffic;
// its address's virtual server keeps only the local endpoints.
func TestLocalPolicySplitsNodeTraffic(t *testing.T) {
	sp := goldenCases()["local-policy-source-ranges"]
	m := newMarks(markIDMask)
	c, err := desire(sp, "rr", true, m.get)
	if err != nil {
		t.Fatal(err)
	}
	lb := addrKey(netip.MustParseAddr("198.51.100.10"), dataplane.TCP, 443)
	mark, ok := c.internal[lb]
	if !ok || !ownMark(mark) {
		t.Fatalf("the LoadBalancer frontend has mark %#x (%v), want one of kpr's", mark, ok)
	}
	if got := c.services[lb].backends; !slices.Equal(got, backends("10.244.0.1:8080")) {
		t.Errorf("outside traffic to the LoadBalancer IP goes to %v, want the local endpoint only", got)
	}
	if got := c.services[ServiceKey{FWMark: mark}].backends; !slices.Equal(got, backends("10.244.0.1:8080", "10.244.1.2:8080")) {
		t.Errorf("the node's own traffic to the LoadBalancer IP goes to %v, want every endpoint", got)
	}
	if _, ok := c.internal[addrKey(netip.MustParseAddr("198.51.100.11"), dataplane.TCP, 443)]; ok {
		t.Error("a Local frontend whose endpoints are all local got a fwmark virtual server it does not need")
	}
	// Marks are stable while the frontend stays, and distinct.
	c2, err := desire(sp, "rr", true, m.get)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for k, v := range c2.internal {
		if c.internal[k] != v {
			t.Errorf("%s: mark %#x, then %#x", k, c.internal[k], v)
		}
		if seen[v] {
			t.Errorf("mark %#x given twice", v)
		}
		seen[v] = true
	}
}

// When every mark is taken, the ServicePort is refused with a message
// saying what to do, rather than sharing a mark.
func TestMarksRunOut(t *testing.T) {
	m := newMarks(markIDMask)
	for id := uint32(1); id <= markIDMask; id++ {
		m.set(ServiceKey{Port: uint16(id)}, masqMark|id)
	}
	_, err := desire(goldenCases()["local-policy-source-ranges"], "rr", true, m.get)
	if err == nil || !strings.Contains(err.Error(), "externalTrafficPolicy Local") {
		t.Fatalf("desire with every mark taken = %v, want an error naming externalTrafficPolicy Local", err)
	}
}
